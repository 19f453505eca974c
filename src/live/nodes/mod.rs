//! What the orchestrator remembers of each node between its frames: the
//! sequence last accepted, whether it is leaving, and the SWIM identity it
//! signed (address and generation), against which every SWIM fact about
//! it is checked: a fact about node N counts only for the identity N
//! signed (design §11). Any other identity at N's address is an impostor:
//! counted, never able to make N live, suspect, dead or outranked; N
//! reported dead because another identity took its address is not taken
//! either (N's heartbeats on its agent connection say whether it lives).
//! The latest fact per identity is held here and nowhere else between
//! foca and the gate: a repeat of it changes nothing and goes no further.
//! The live orchestrator and the simulator (the `poolgate-sim` crate)
//! both go through it; public for that crate only, hidden from the docs.

use std::collections::HashMap;
use std::net::SocketAddr;

use poolgate_actors::core::{
    FaultReason, IdentityMaterial, MembershipUpdate, NodeId, Observation, SwimState,
};

use super::conversation::Accepted;
use super::swim::tracker::SwimFact;
use super::wire::Announcement;

/// What the orchestrator remembers of each node between frames.
#[derive(Debug, Default)]
pub struct Nodes {
    /// The last sequence accepted per node (replay protection): the map
    /// the state store keeps whole.
    last_seq: HashMap<NodeId, u64>,
    /// Everything else held of each node, in one place.
    each: HashMap<NodeId, Node>,
    /// The identities the nodes signed, by address: the one index beside
    /// [`Node::signed`], for the SWIM member to decide address conflicts
    /// by (foca asks by address).
    signed_view: super::swim::identity::SignedView,
    /// When this orchestrator's term began (set by the orchestrator; see
    /// [`TERM_GRACE`]).
    term_started: Option<std::time::Instant>,
    /// Among replicas, whether the leader's own term is in doubt (its
    /// lease not renewed lately: etcd out of its reach); see
    /// [`Nodes::holds_back_silence`].
    term_in_doubt: TermInDoubt,
}

/// Whether the term is in doubt (see [`Nodes::set_term_in_doubt`]); never, for
/// an orchestrator alone.
#[derive(Clone, Default)]
pub struct TermInDoubt(pub Option<std::sync::Arc<dyn Fn() -> bool + Send + Sync>>);

impl std::fmt::Debug for TermInDoubt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "TermInDoubt(..)"
        } else {
            "TermInDoubt(never)"
        })
    }
}

/// What is held of one node besides its sequence.
#[derive(Debug, Default)]
struct Node {
    /// The life of the node's last sequence as the state store held it
    /// when this term began, until its first frame in the term: a first
    /// frame of another life comes from a process started since
    /// ([`Nodes::replaced_since_stored`]).
    stored_life: Option<u64>,
    /// It announced it is leaving: SWIM's `dead` is its `left`.
    leaving: bool,
    /// The SWIM identity it signed in its latest frame that named one
    /// (address, and generation if it signs one): SWIM facts about it
    /// count only for that identity.
    signed: Option<Signed>,
    /// The agent connection it was last heard on (an id of the
    /// listener's), so a lost connection is told from a replaced one.
    attached: Option<u64>,
    /// Its last accepted frame: on which connection, from where, naming
    /// which SWIM identity, when. A second live process signing as the
    /// node shows as frames with two identities on two connections at
    /// once.
    heard: Option<Heard>,
    /// The SWIM facts held of it: the one table of them between foca and
    /// the gate.
    swim: NodeSwim,
}

/// For this long after a term begins, a node not heard from in it yet is
/// vouched for ([`Nodes::vouches`]): its agent reconnects to the new
/// leader within a few seconds, and meanwhile the probes of it, lost to
/// UDP, would fault a run on nothing but the takeover. A node that never
/// comes back is not ready in this term, and a restored run's required
/// node not seen ready within `[state] restore_grace` faults it
/// `unconfirmed`.
pub const TERM_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// One accepted agent frame, as [`Nodes::heard_from`] takes it.
#[derive(Debug, Clone, Copy)]
struct FrameHeard {
    /// The listener's id of the connection it came on.
    connection: u64,
    /// Where it came from.
    peer: SocketAddr,
    /// The life of its sequence (`seq >> COUNTER_BITS`): a process's
    /// frames share it (until its counter wraps); a restarted process
    /// takes a new one from its generation file.
    life: u64,
    /// The SWIM identity it signs (address, generation).
    identity: (Option<SocketAddr>, Option<u64>),
    /// How often the node said it sends a frame when nothing changes.
    heartbeat: std::time::Duration,
}

/// A node's last accepted frame, and when (see [`Nodes::heard_from`]).
#[derive(Debug, Clone, Copy)]
struct Heard {
    frame: FrameHeard,
    at: std::time::Instant,
    /// Its connection has ended (it stays attached a while: through the
    /// lost-connection grace, or for good after the node's `leaving`).
    closed: bool,
}

impl Heard {
    /// Whether the frame came no more than a heartbeat (at most
    /// [`VOUCH_HEARTBEAT_LIMIT`]) and [`VOUCH_SLACK`] before `now`.
    fn fresh(&self, now: std::time::Instant) -> bool {
        let within = self.frame.heartbeat.min(VOUCH_HEARTBEAT_LIMIT) + VOUCH_SLACK;
        now.saturating_duration_since(self.at) <= within
    }
}

/// How late past its heartbeat a node's latest frame may be for the
/// orchestrator to vouch for its SWIM member ([`Nodes::vouches`]).
pub const VOUCH_SLACK: std::time::Duration = std::time::Duration::from_millis(150);

/// The longest heartbeat vouching waits out: a node whose frames come
/// further apart is vouched for only within this (and [`VOUCH_SLACK`]) of
/// its latest frame, so a frozen node with a long heartbeat is still found
/// by SWIM, not only after its connection's few silent heartbeats.
pub const VOUCH_HEARTBEAT_LIMIT: std::time::Duration = std::time::Duration::from_secs(1);

/// One accepted agent frame, as [`Nodes::take_frame`] takes it.
#[derive(Debug)]
pub struct Frame {
    /// What its connection's conversation accepted.
    pub accepted: Accepted,
    /// The listener's id of the connection it came on.
    pub connection: u64,
    /// Where it came from.
    pub peer: SocketAddr,
}

/// What an accepted frame comes to ([`Nodes::take_frame`]).
#[derive(Debug)]
pub struct Taken {
    /// The node.
    pub node: NodeId,
    /// The frame's sequence, to acknowledge.
    pub seq: u64,
    /// The first frame accepted on its connection.
    pub first: bool,
    /// The node's earlier connection, if another: it is superseded.
    pub superseded: Option<u64>,
    /// The address of another open connection on which a frame naming
    /// another identity of the node was accepted lately: two live
    /// processes sign as the node.
    pub twin: Option<SocketAddr>,
    /// What the frame says for the gate, in order (nothing for a
    /// heartbeat that repeats the state).
    pub observations: Vec<Observation>,
    /// The SWIM address the node newly signed: a member this SWIM member
    /// may not know (it restarted, or this orchestrator did), asked to
    /// join.
    pub join: Option<SocketAddr>,
    /// The answer to the frame's question, if it asked one.
    pub vouch: Option<super::wire::Vouch>,
}

/// How a node's frame comes from another process than the one before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Replaced {
    /// It signs a new SWIM identity in this term ([`Nodes::new_process`]).
    InTerm,
    /// Its first frame in this term is of another life than the state
    /// store held ([`Nodes::replaced_since_stored`]).
    SinceStored,
}

/// The fault a node replaced unheard is told with.
const REPLACED_UNHEARD: &str =
    "its process was replaced since the last frame the state store holds";

/// The SWIM identity a node signed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Signed {
    /// Where it answers.
    pub addr: SocketAddr,
    /// Its generation; `None` from an agent that does not sign it (then
    /// any generation at the address counts, the newest outranking).
    pub generation: Option<u64>,
}

impl Signed {
    fn matches(&self, addr: SocketAddr, generation: u64) -> bool {
        self.addr == addr && self.generation.is_none_or(|g| g == generation)
    }
}

/// The generation folded into a SWIM fact's incarnation (see
/// `live::swim::tracker`).
fn generation_of(update: &MembershipUpdate) -> u64 {
    update.incarnation >> 16
}

/// What is held of one node's SWIM facts.
#[derive(Debug, Default)]
pub struct NodeSwim {
    /// The latest fact per identity (address, generation), so a node's
    /// state is known the moment it signs it.
    identities: HashMap<(SocketAddr, u64), UnsignedFacts>,
    /// The incarnation of the last fact the gate was told of the node: a
    /// leave is told at it (whatever identity the node signs next, and
    /// however many identities others invent under its name).
    told: Option<u64>,
}

impl NodeSwim {
    /// The key of the newest identity held that `signed` names.
    fn signed_key(&self, signed: Signed) -> Option<(SocketAddr, u64)> {
        self.identities
            .keys()
            .filter(|(at, g)| signed.matches(*at, *g))
            .max_by_key(|(_, g)| *g)
            .copied()
    }
}

/// The SWIM facts held for one (node, address) until the node signs it:
/// the latest, and the last `alive` before it, so that a suspicion heard
/// before the node's first frame is not dropped as a suspicion of a member
/// never seen alive.
#[derive(Debug, Clone)]
pub struct UnsignedFacts {
    alive: Option<MembershipUpdate>,
    latest: MembershipUpdate,
}

/// What [`Nodes::observe`] made of a SWIM fact.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kept {
    /// The fact held for its identity already: nothing changed.
    Repeat,
    /// A new fact, held; not for the gate (the node has not signed that
    /// identity, or another identity took its address).
    Held,
    /// A new fact about the identity the node signed, as the gate is told
    /// it.
    ForGate(MembershipUpdate),
}

impl Kept {
    /// The update for the gate, if any.
    pub fn for_gate(self) -> Option<MembershipUpdate> {
        match self {
            Kept::ForGate(update) => Some(update),
            Kept::Repeat | Kept::Held => None,
        }
    }

    /// Whether the fact changed what is held.
    pub fn is_new(&self) -> bool {
        !matches!(self, Kept::Repeat)
    }
}

/// How many identities' facts are kept per node name (impostors
/// included); a new one past this evicts the oldest generation held, never
/// the identity the node signed.
const ADDRESSES_PER_NODE: usize = 8;

impl Nodes {
    /// What is held of `node`, if anything.
    fn node(&self, node: &str) -> Option<&Node> {
        self.each.get(node)
    }

    /// What is held of `node`, made if nothing was.
    fn node_mut(&mut self, node: &NodeId) -> &mut Node {
        self.each.entry(node.clone()).or_default()
    }

    /// The nodes heard from in this term, with their last frames.
    fn heard(&self) -> impl Iterator<Item = (&NodeId, &Heard)> {
        self.each
            .iter()
            .filter_map(|(node, held)| Some((node, held.heard.as_ref()?)))
    }

    /// A SWIM fact from the node's signed address, as the gate is told it
    /// (and noted as told): a leaving node's `dead` is its `left`.
    fn for_gate(held: &mut Node, mut update: MembershipUpdate) -> MembershipUpdate {
        if update.state == SwimState::Dead && held.leaving {
            update.state = SwimState::Left;
        }
        held.swim.told = Some(update.incarnation);
        update
    }

    /// Keeps a SWIM fact: a repeat of the fact held for its identity
    /// changes nothing; a new one is held, and is for the gate if it is
    /// about the identity the node signed.
    pub fn observe(&mut self, observed: SwimFact) -> Kept {
        let generation = generation_of(&observed.update);
        let key = (observed.addr, generation);
        let mut update = observed.update;
        // A repeat, the common case, is found with two lookups and
        // nothing copied.
        let held = self
            .node(update.node.as_str())
            .and_then(|held| held.swim.identities.get(&key))
            .map(|held| (held.latest.state, held.latest.incarnation));
        if observed.replaced {
            // Dead by replacement, at what was last held of the identity;
            // an identity never heard of has nothing to lose.
            let Some((_, incarnation)) = held else {
                return Kept::Repeat;
            };
            update.incarnation = update.incarnation.max(incarnation);
        }
        if held == Some((update.state, update.incarnation)) {
            return Kept::Repeat;
        }
        let node = self.node_mut(&update.node);
        let signed = node.signed;
        let record = &mut node.swim;
        if record.identities.len() >= ADDRESSES_PER_NODE && held.is_none() {
            // Others' inventions under the node's name cannot push out
            // the identity it signed.
            let protected = signed.and_then(|signed| record.signed_key(signed));
            let oldest = record
                .identities
                .keys()
                .filter(|k| Some(**k) != protected)
                .min_by_key(|(_, g)| *g)
                .copied();
            if let Some(oldest) = oldest {
                record.identities.remove(&oldest);
            }
        }
        let facts = &mut record.identities;
        let alive = match facts.get(&key) {
            _ if update.state == SwimState::Alive => Some(update.clone()),
            Some(held) => held.alive.clone(),
            None => None,
        };
        facts.insert(
            key,
            UnsignedFacts {
                alive,
                latest: update.clone(),
            },
        );
        match signed {
            Some(signed) if signed.matches(observed.addr, generation) => {
                if observed.replaced && signed.generation.is_some() {
                    // Another identity took the node's address: that is
                    // not the node's own evidence of anything.
                    metrics::counter!("poolgate_swim_impostors_total").increment(1);
                    tracing::debug!(node = %update.node, addr = %observed.addr, "the node's SWIM identity replaced by another at its address; ignored");
                    return Kept::Held;
                }
                Kept::ForGate(Self::for_gate(node, update))
            }
            Some(_) => {
                metrics::counter!("poolgate_swim_impostors_total").increment(1);
                tracing::debug!(node = %update.node, addr = %observed.addr, generation, "SWIM fact about an identity the node did not sign; ignored");
                Kept::Held
            }
            // Held until the node signs its identity.
            None => Kept::Held,
        }
    }

    /// The node table of a term that begins now ([`TERM_GRACE`]).
    pub fn starting_now() -> Nodes {
        Nodes {
            term_started: Some(std::time::Instant::now()),
            ..Nodes::default()
        }
    }

    /// The signed identities by address, for this orchestrator's SWIM
    /// member to decide address conflicts by (kept by [`Nodes::take_frame`]).
    pub fn signed_view(&self) -> super::swim::identity::SignedView {
        std::sync::Arc::clone(&self.signed_view)
    }

    /// Among replicas, how to tell whether the leader's own term is in
    /// doubt (see [`Nodes::holds_back_silence`]).
    pub fn set_term_in_doubt(&mut self, in_doubt: TermInDoubt) {
        self.term_in_doubt = in_doubt;
    }

    /// The last sequence accepted per node (replay protection), as the
    /// state store keeps them.
    pub fn sequences(&self) -> &HashMap<NodeId, u64> {
        &self.last_seq
    }

    /// The same, for a frame's admission to advance
    /// ([`super::conversation::Conversation::admit`]).
    pub fn sequences_mut(&mut self) -> &mut HashMap<NodeId, u64> {
        &mut self.last_seq
    }

    /// The last sequences the state store held when this term began
    /// (replay protection across restarts and takeovers), and the life of
    /// each, for [`Nodes::replaced_since_stored`].
    pub fn restore_sequences(&mut self, stored: HashMap<NodeId, u64>) {
        for held in self.each.values_mut() {
            held.stored_life = None;
        }
        for (node, seq) in &stored {
            self.node_mut(node).stored_life = Some(seq >> super::wire::COUNTER_BITS);
        }
        self.last_seq = stored;
    }

    /// Whether `frame`, `node`'s first accepted in this term, comes from
    /// another process than the one whose frames the state store held
    /// when the term began: another life of sequences (design §9). The
    /// process the store knew is gone, though nobody heard it go (it was
    /// killed and started again while no orchestrator led, or before it
    /// reconnected to this one). A counter that wrapped into its next life
    /// in that gap reads the same, and fails safe. Asked of every frame;
    /// only a node's first in the term can answer yes.
    fn replaced_since_stored(&mut self, node: &NodeId, frame: &FrameHeard) -> bool {
        self.each
            .get_mut(node)
            .and_then(|held| held.stored_life.take())
            .is_some_and(|life| life != frame.life)
    }

    /// Whether `frame` of `node` comes from another process than the one
    /// that signed the node's SWIM identity before it (design §11): it
    /// signs another generation, and neither on the connection nor in the
    /// life of sequences of the node's last frame. The same process
    /// renewing its identity after SWIM declared it down (foca's renewal:
    /// its generation + 1) keeps both; a restarted one has neither, however
    /// soon it connected. To be asked before [`Nodes::heard_from`] records
    /// the frame.
    fn new_process(&self, node: &NodeId, frame: &FrameHeard) -> bool {
        let Some(held) = self.node(node.as_str()) else {
            return false;
        };
        let Some(before) = held.signed.and_then(|s| s.generation) else {
            return false;
        };
        if frame.identity.1.is_none_or(|now| now == before) {
            return false;
        }
        held.heard.as_ref().is_none_or(|last| {
            last.frame.connection != frame.connection && last.frame.life != frame.life
        })
    }

    /// `node`'s agent connection `connection` ended (closed, failed or
    /// silent): a frame of another identity on another connection after
    /// this is a process that took over from the one that ended (a
    /// restart), not a second one signing beside it.
    pub fn connection_closed(&mut self, node: &NodeId, connection: u64) {
        if let Some(heard) = self.each.get_mut(node).and_then(|h| h.heard.as_mut()) {
            if heard.frame.connection == connection {
                heard.closed = true;
            }
        }
    }

    /// `frame` of `node` accepted at `now`: the other connection's address
    /// if a frame naming another identity was accepted on another
    /// connection within `within` (two processes sign as one node: a
    /// copied config, or a stolen key). One process on two connections
    /// (several addresses of one orchestrator) names one identity on both.
    fn heard_from(
        &mut self,
        node: &NodeId,
        frame: FrameHeard,
        now: std::time::Instant,
        within: std::time::Duration,
    ) -> Option<SocketAddr> {
        let (id, identity) = (frame.connection, frame.identity);
        let heard = Heard {
            frame,
            at: now,
            closed: false,
        };
        let held = self.node_mut(node);
        // The earlier connection counts while it is still open (one that
        // closed was a process that ended, not a twin).
        let attached = held.attached;
        let open = |before: &Heard| !before.closed && attached == Some(before.frame.connection);
        match held.heard.replace(heard) {
            Some(before)
                if before.frame.connection != id
                    && before.frame.identity != identity
                    && now.duration_since(before.at) < within
                    && open(&before) =>
            {
                Some(before.frame.peer)
            }
            _ => None,
        }
    }

    /// Whether the SWIM member `probed` lives by its node's own evidence
    /// at `now` (design §15), or has not been heard from yet in a term
    /// that began less than [`TERM_GRACE`] ago: the node's agent connection is up, its
    /// latest frame, on that connection, signed exactly that identity
    /// (address and generation), and came no more than a heartbeat (and
    /// [`VOUCH_SLACK`]) ago. A member that is gone, stalled or cut off
    /// sends no frames, so it is never vouched for; an impostor at a
    /// node's address is not the identity the node signed.
    ///
    /// Unless the silence is not the member's own: when no other node
    /// has spoken since the member's frame was due (two or more heard in
    /// this term), the likelier cause is here (this host cut off, this
    /// process stalled), and accusing every node would outlive the cause:
    /// once healed, the news would make every node renew its identity.
    /// Then it is vouched for, as a follower does (counted:
    /// `poolgate_swim_self_doubt_total`); a node that is really gone still
    /// ends as its connection does. (An operator's trial: with "every
    /// connection stale" as the rule, a probe just after a cut found one
    /// node's frame 0.9 s old and another's 0.56 s old, still fresh, and
    /// the leader suspected the first.)
    pub fn vouches(&self, probed: &super::swim::SwimIdentity, now: std::time::Instant) -> bool {
        let held = self.node(probed.node.as_str());
        let Some(heard) = held.and_then(|h| h.heard.as_ref()) else {
            // Not heard from in this term: vouched for while it begins.
            return self.term_begins(now) || self.doubts_itself(now);
        };
        let attached = held.and_then(|h| h.attached) == Some(heard.frame.connection);
        let signed = heard.frame.identity == (Some(probed.addr), Some(probed.generation));
        if !signed {
            // Another identity at its address: vouched for only when
            // nobody is heard at all.
            return self.doubts_itself(now);
        }
        if attached && heard.fresh(now) {
            return true;
        }
        let due = heard.at + heard.frame.heartbeat.min(VOUCH_HEARTBEAT_LIMIT) + VOUCH_SLACK;
        let others_spoke = self
            .heard()
            .any(|(node, other)| node.as_str() != probed.node && other.at > due);
        let doubts = self.heard().nth(1).is_some() && !others_spoke;
        if doubts {
            metrics::counter!("poolgate_swim_self_doubt_total").increment(1);
        }
        doubts
    }

    /// Whether no node is heard at `now`, two or more heard in this term:
    /// none of their latest frames, on a connection open or closed since,
    /// is fresh (see [`Nodes::vouches`]).
    fn doubts_itself(&self, now: std::time::Instant) -> bool {
        let doubts = self.heard().nth(1).is_some() && !self.heard().any(|(_, h)| h.fresh(now));
        if doubts {
            metrics::counter!("poolgate_swim_self_doubt_total").increment(1);
        }
        doubts
    }

    /// Whether a connection closed for its silence is held back from
    /// making its node unavailable at `now`: among replicas, while the
    /// leader's own term is in doubt (its lease not renewed lately) and
    /// every connection went silent at once ([`Nodes::doubts_itself`]),
    /// the leader is the one cut off. Its term ends within the lease, and
    /// the next leader guards the runs from a fresh view; healed before,
    /// its connections speak again. Otherwise a blip on the leader's own
    /// host would fault every run it guards (an operator's trial: a cut
    /// of 2.5 to 4.2 s did). A lone orchestrator, with nothing to tell
    /// the two apart, never holds back.
    pub fn holds_back_silence(&self, now: std::time::Instant) -> bool {
        self.term_in_doubt
            .0
            .as_ref()
            .is_some_and(|in_doubt| in_doubt())
            && self.doubts_itself(now)
    }

    /// The node signed `addr` (and `generation`): binds them, and returns
    /// the facts heard about that identity, for the gate in order (the
    /// last `alive`, then the latest), if the binding changed.
    pub fn bind(
        &mut self,
        node: &NodeId,
        addr: SocketAddr,
        generation: Option<u64>,
    ) -> Option<Vec<MembershipUpdate>> {
        let signed = Signed { addr, generation };
        let before = self.node_mut(node).signed.replace(signed);
        if before == Some(signed) {
            return None;
        }
        if let Some(before) = before.filter(|b| b.addr != addr) {
            self.unview(node, before.addr);
        }
        if let Ok(mut view) = self.signed_view.write() {
            match generation {
                Some(generation) => view.insert(addr, (node.to_string(), generation)),
                None => view.remove(&addr),
            };
        }
        let mut facts = Vec::new();
        let node = self.node_mut(node);
        if let Some(held) = node.signed_held().cloned() {
            if let Some(alive) = held.alive.filter(|a| *a != held.latest) {
                facts.push(Self::for_gate(node, alive));
            }
            facts.push(Self::for_gate(node, held.latest));
        }
        Some(facts)
    }

    /// Takes `node`'s identity at `addr` out of the signed view, if it is
    /// still the one there.
    fn unview(&self, node: &NodeId, addr: SocketAddr) {
        if let Ok(mut view) = self.signed_view.write() {
            if view.get(&addr).is_some_and(|(n, _)| n == node.as_str()) {
                view.remove(&addr);
            }
        }
    }

    /// `node` is registered with another key (or for the first time): the
    /// sequences of the key before go (a thief's 2^64 − 1 does not lock
    /// the new key out); the rest stays, its connection above all, whose
    /// loss (its frames under the old key refused) makes it not available.
    pub fn key_pinned(&mut self, node: &NodeId) {
        self.last_seq.remove(node);
    }

    /// `node` left the registry: everything held of it goes (its last
    /// sequence, the identity it signed, its connection, its SWIM facts),
    /// so a node registered again under its name starts afresh.
    pub fn forget(&mut self, node: &NodeId) {
        self.last_seq.remove(node);
        if let Some(signed) = self.each.remove(node).and_then(|held| held.signed) {
            self.unview(node, signed.addr);
        }
    }

    /// Takes an accepted `frame` of its node at `now` (design §8, §11):
    /// records where and when it was heard and which connection the node
    /// is on, tells a process that replaced another from a renewal, binds
    /// the SWIM identity it signs, and says what the frame comes to. The
    /// one place an agent frame changes what is held of its node; the
    /// listener does the I/O around it. `within`: how long the connection
    /// may be silent (two processes signing as the node show as frames
    /// with two identities on two open connections within it); `own_swim`:
    /// this orchestrator's own SWIM member, which lives (it is answering).
    pub fn take_frame(
        &mut self,
        frame: Frame,
        now: std::time::Instant,
        within: std::time::Duration,
        own_swim: SocketAddr,
    ) -> Taken {
        let Frame {
            accepted:
                Accepted {
                    node,
                    seq,
                    announcement,
                    repeats,
                    first,
                    ask,
                },
            connection,
            peer,
        } = frame;
        let heard = FrameHeard {
            connection,
            peer,
            life: seq >> super::wire::COUNTER_BITS,
            identity: (announcement.swim, announcement.generation),
            heartbeat: announcement.heartbeat_ms.map_or(
                std::time::Duration::from_secs(1),
                std::time::Duration::from_millis,
            ),
        };
        let replaced = if self.replaced_since_stored(&node, &heard) {
            Some(Replaced::SinceStored)
        } else {
            self.new_process(&node, &heard).then_some(Replaced::InTerm)
        };
        // A node of which no frame is held (forgotten since its last, then
        // registered again) is told whole, heartbeat or not: the gate
        // forgot what it said.
        let unheard = self
            .node(node.as_str())
            .is_none_or(|held| held.heard.is_none());
        let twin = self.heard_from(&node, heard, now, within);
        let superseded = self
            .node_mut(&node)
            .attached
            .replace(connection)
            .filter(|before| *before != connection);
        // A heartbeat repeats the state: nothing to apply.
        let (observations, join) = match repeats && !unheard {
            true => (Vec::new(), None),
            false => self.said(&node, &announcement, replaced),
        };
        // A question beside the state: does a member this node probed in
        // vain live, by its own agent connection (design §15)?
        let vouch = ask.map(|ask| {
            let ask = *ask;
            let probed = super::swim::SwimIdentity::new(ask.node.clone(), ask.swim, ask.generation);
            let own = probed.node == super::swim::member::ORCHESTRATOR && probed.addr == own_swim;
            let alive = own || self.vouches(&probed, now);
            metrics::counter!("poolgate_agent_vouches_total", "alive" => if alive { "yes" } else { "no" }).increment(1);
            super::wire::Vouch { ask, alive }
        });
        Taken {
            node,
            seq,
            first,
            superseded,
            twin,
            observations,
            join,
            vouch,
        }
    }

    /// What a node's announced state comes to for the gate, in order, at
    /// one instant (one trip to the node's actor), and the SWIM address
    /// it newly signed, if any. `replaced`: the frame comes from another
    /// process than the one before it; the one it replaces is gone,
    /// however soon the new one connected (within the lost-connection
    /// grace, a crash would pass unseen).
    fn said(
        &mut self,
        node: &NodeId,
        state: &Announcement,
        replaced: Option<Replaced>,
    ) -> (Vec<Observation>, Option<SocketAddr>) {
        let bound = state
            .swim
            .and_then(|addr| self.bind(node, addr, state.generation).map(|f| (addr, f)));
        let held = self.node_mut(node);
        held.leaving = state.leaving;
        let leaving_incarnation = state.leaving.then(|| held.swim.told.unwrap_or(0));
        let mut observations = Vec::new();
        match replaced {
            Some(Replaced::InTerm) => {
                tracing::info!(%node, generation = ?state.generation, "the node signs a new SWIM identity from a new process (another connection, another life of its sequences): unavailable until the new identity is seen alive");
                observations.push(Observation::Unavailable);
            }
            Some(Replaced::SinceStored) => {
                // Nothing heard it go: told as a fault, which a restored
                // run's required node does not wait out (design §9), and
                // cleared by the frame's own state below.
                tracing::info!(%node, "the node's process was replaced since the last frame the state store holds (restarted, or taking the node back from another process that signed as it, while no orchestrator heard it): told as a fault, which a run that requires it does not survive");
                metrics::counter!("poolgate_agent_replaced_unheard_total").increment(1);
                observations.push(Observation::Faulted {
                    reason: FaultReason::new(REPLACED_UNHEARD),
                });
            }
            None => {}
        }
        let join = bound.map(|(addr, latest)| {
            observations.extend(latest.into_iter().map(|u| u.into_observation().1));
            addr
        });
        if let Some(incarnation) = leaving_incarnation {
            // The node's own word: it leaves, it did not crash.
            observations.push(Observation::Swim {
                state: SwimState::Left,
                incarnation,
            });
        }
        if let Some(material) = super::wire::identity_bytes(state) {
            match material.map(IdentityMaterial::new) {
                Ok(Ok(material)) => {
                    observations.push(Observation::Identity(material.fingerprint()))
                }
                Ok(Err(e)) => {
                    // Counted as the gate counts any invalid material.
                    poolgate_actors::telemetry::rejected(
                        poolgate_actors::GateError::from(e.clone()).code(),
                    );
                    tracing::warn!(%node, error = %e, "announced identity refused");
                }
                Err(()) => tracing::warn!(%node, "announced identity is not base64; refused"),
            }
        }
        observations.push(match &state.fault {
            Some(reason) => Observation::Faulted {
                reason: FaultReason::new(reason),
            },
            None => Observation::Recovered,
        });
        observations.push(if state.available && !state.leaving {
            Observation::Available
        } else {
            Observation::Unavailable
        });
        (observations, join)
    }

    /// Whether `node` is still on `connection` (no newer connection of it
    /// was accepted since).
    pub fn attached_on(&self, node: &NodeId, connection: u64) -> bool {
        self.node(node.as_str()).and_then(|held| held.attached) == Some(connection)
    }

    /// Whether another connection than `connection`, still open, carried
    /// `node`'s latest accepted frame: another process signs as the node
    /// now (a copy of its config and key), and a frame of `connection`
    /// refused as a replay is that process's doing, not a stale life to
    /// leave behind.
    ///
    /// A node not heard from yet in a term that began less than
    /// [`TERM_GRACE`] before `now` counts as signed elsewhere: the process
    /// whose sequences the store holds may be reconnecting still (an
    /// operator's trial: after a takeover the waiting real node took the
    /// node back from a copy that had held it, then lost it to the copy
    /// reconnecting, then took it again).
    pub fn signed_elsewhere(
        &self,
        node: &NodeId,
        connection: u64,
        now: std::time::Instant,
    ) -> bool {
        match self
            .node(node.as_str())
            .and_then(|held| held.heard.as_ref())
        {
            Some(last) => last.frame.connection != connection && !last.closed,
            None => self.term_begins(now),
        }
    }

    /// Whether the term began less than [`TERM_GRACE`] before `now`.
    fn term_begins(&self, now: std::time::Instant) -> bool {
        self.term_started
            .is_some_and(|started| now.saturating_duration_since(started) < TERM_GRACE)
    }

    /// Whether `node`, still on `connection`, whose connection went silent,
    /// is held back from being made unavailable at `now`
    /// ([`Nodes::holds_back_silence`]).
    pub fn holds_back(&self, node: &NodeId, connection: u64, now: std::time::Instant) -> bool {
        self.attached_on(node, connection) && self.holds_back_silence(now)
    }

    /// Lets `node` go from `connection` if it is still on it (its loss
    /// is then the node's); whether it was.
    pub fn detach(&mut self, node: &NodeId, connection: u64) -> bool {
        let still = self.attached_on(node, connection);
        if still {
            self.node_mut(node).attached = None;
        }
        still
    }

    /// Every identity's latest fact held, with its address (the tracker's
    /// tests check them against foca's whole view).
    #[doc(hidden)]
    pub fn held(&self) -> impl Iterator<Item = (SocketAddr, &MembershipUpdate)> {
        self.each.values().flat_map(|held| {
            held.swim
                .identities
                .iter()
                .map(|((addr, _), held)| (*addr, &held.latest))
        })
    }

    /// The incarnation of the last SWIM fact the gate was told of `node`
    /// (a leave is told at it), if any.
    pub fn told_incarnation(&self, node: &NodeId) -> Option<u64> {
        self.node(node.as_str())?.swim.told
    }
}

impl Node {
    /// The facts held for the identity the node signed (its newest
    /// generation, if it signs none).
    fn signed_held(&self) -> Option<&UnsignedFacts> {
        let key = self.swim.signed_key(self.signed?)?;
        self.swim.identities.get(&key)
    }
}

#[cfg(test)]
mod tests;
