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

use std::collections::{HashMap, HashSet};
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
    /// The last sequence accepted per node (replay protection).
    last_seq: HashMap<NodeId, u64>,
    /// The life of each node's last sequence as the state store held it
    /// when this term began, until the node's first frame in the term: a
    /// first frame of another life comes from a process started since
    /// ([`Nodes::replaced_since_stored`]).
    stored_life: HashMap<NodeId, u64>,
    /// Nodes that announced they are leaving: SWIM's `dead` is their `left`.
    leaving: HashSet<NodeId>,
    /// The SWIM identity each node signed in its latest frame (address,
    /// and generation if it signs one): SWIM facts about the node count
    /// only for it.
    swim_addr: HashMap<NodeId, Signed>,
    /// The agent connection each node was last heard on (an id of the
    /// listener's), so a lost connection is told from a replaced one.
    attached: HashMap<NodeId, u64>,
    /// Each node's last accepted frame: on which connection, from where,
    /// naming which SWIM identity, when. A second live process signing as
    /// the node shows as frames with two identities on two connections at
    /// once.
    heard: HashMap<NodeId, Heard>,
    /// The SWIM facts held per node: the one table of them between foca
    /// and the gate.
    latest: HashMap<NodeId, NodeSwim>,
    /// The signed identities by address, for the SWIM member to decide
    /// address conflicts by.
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
    /// A SWIM fact from the node's signed address, as the gate is told it
    /// (and noted as told): a leaving node's `dead` is its `left`.
    fn for_gate(&mut self, mut update: MembershipUpdate) -> MembershipUpdate {
        if update.state == SwimState::Dead && self.leaving.contains(&update.node) {
            update.state = SwimState::Left;
        }
        if let Some(held) = self.latest.get_mut(&update.node) {
            held.told = Some(update.incarnation);
        }
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
            .latest
            .get(&update.node)
            .and_then(|record| record.identities.get(&key))
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
        let signed = self.swim_addr.get(&update.node).copied();
        let record = self.latest.entry(update.node.clone()).or_default();
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
                Kept::ForGate(self.for_gate(update))
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
    /// ([`super::conversation::Conversation::admit`]) and a node the
    /// registry dropped to leave.
    pub fn sequences_mut(&mut self) -> &mut HashMap<NodeId, u64> {
        &mut self.last_seq
    }

    /// The last sequences the state store held when this term began
    /// (replay protection across restarts and takeovers), and the life of
    /// each, for [`Nodes::replaced_since_stored`].
    pub fn restore_sequences(&mut self, stored: HashMap<NodeId, u64>) {
        self.stored_life = stored
            .iter()
            .map(|(node, seq)| (node.clone(), seq >> super::wire::COUNTER_BITS))
            .collect();
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
        self.stored_life
            .remove(node)
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
        let Some(before) = self.swim_addr.get(node).and_then(|s| s.generation) else {
            return false;
        };
        if frame.identity.1.is_none_or(|now| now == before) {
            return false;
        }
        self.heard.get(node).is_none_or(|last| {
            last.frame.connection != frame.connection && last.frame.life != frame.life
        })
    }

    /// `node`'s agent connection `connection` ended (closed, failed or
    /// silent): a frame of another identity on another connection after
    /// this is a process that took over from the one that ended (a
    /// restart), not a second one signing beside it.
    pub fn connection_closed(&mut self, node: &NodeId, connection: u64) {
        if let Some(heard) = self.heard.get_mut(node) {
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
        // The earlier connection counts while it is still open (one that
        // closed was a process that ended, not a twin).
        let open = |before: &Heard| {
            !before.closed && self.attached.get(node) == Some(&before.frame.connection)
        };
        match self.heard.insert(node.clone(), heard) {
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
        let Some(heard) = self.heard.get(probed.node.as_str()) else {
            // Not heard from in this term: vouched for while it begins.
            return self
                .term_started
                .is_some_and(|started| now.saturating_duration_since(started) < TERM_GRACE)
                || self.doubts_itself(now);
        };
        let attached = self.attached.get(probed.node.as_str()) == Some(&heard.frame.connection);
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
            .heard
            .iter()
            .any(|(node, other)| node.as_str() != probed.node && other.at > due);
        let doubts = self.heard.len() >= 2 && !others_spoke;
        if doubts {
            metrics::counter!("poolgate_swim_self_doubt_total").increment(1);
        }
        doubts
    }

    /// Whether no node is heard at `now`, two or more heard in this term:
    /// none of their latest frames, on a connection open or closed since,
    /// is fresh (see [`Nodes::vouches`]).
    fn doubts_itself(&self, now: std::time::Instant) -> bool {
        let doubts = self.heard.len() >= 2 && !self.heard.values().any(|h| h.fresh(now));
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
        let before = self.swim_addr.insert(node.clone(), signed);
        if before == Some(signed) {
            return None;
        }
        if let Ok(mut view) = self.signed_view.write() {
            if let Some(before) = before.filter(|b| b.addr != addr) {
                if view
                    .get(&before.addr)
                    .is_some_and(|(n, _)| n == node.as_str())
                {
                    view.remove(&before.addr);
                }
            }
            match generation {
                Some(generation) => view.insert(addr, (node.to_string(), generation)),
                None => view.remove(&addr),
            };
        }
        let mut facts = Vec::new();
        if let Some(held) = self.signed_held(node).cloned() {
            if let Some(alive) = held.alive.filter(|a| *a != held.latest) {
                facts.push(self.for_gate(alive));
            }
            facts.push(self.for_gate(held.latest));
        }
        Some(facts)
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
        let twin = self.heard_from(&node, heard, now, within);
        let superseded = self
            .attached
            .insert(node.clone(), connection)
            .filter(|before| *before != connection);
        // A heartbeat repeats the state: nothing to apply.
        let (observations, join) = match repeats {
            true => (Vec::new(), None),
            false => self.said(&node, &announcement, replaced),
        };
        // A question beside the state: does a member this node probed in
        // vain live, by its own agent connection (design §15)?
        let vouch = ask.map(|ask| {
            let ask = *ask;
            let probed = super::swim::SwimIdentity {
                node: ask.node.clone(),
                addr: ask.swim,
                generation: ask.generation,
            };
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
        let leaving_incarnation = if state.leaving {
            self.leaving.insert(node.clone());
            Some(self.told_incarnation(node).unwrap_or(0))
        } else {
            self.leaving.remove(node);
            None
        };
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
                tracing::info!(%node, "the node's process was replaced since the last frame the state store holds (restarted while no orchestrator heard it): told as a fault, which a run that requires it does not survive");
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
        self.attached.get(node) == Some(&connection)
    }

    /// Whether another connection than `connection`, still open, carried
    /// `node`'s latest accepted frame: another process signs as the node
    /// now (a copy of its config and key), and a frame of `connection`
    /// refused as a replay is that process's doing, not a stale life to
    /// leave behind.
    pub fn signed_elsewhere(&self, node: &NodeId, connection: u64) -> bool {
        self.heard
            .get(node)
            .is_some_and(|last| last.frame.connection != connection && !last.closed)
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
            self.attached.remove(node);
        }
        still
    }

    /// Every identity's latest fact held, with its address (the tracker's
    /// tests check them against foca's whole view).
    #[doc(hidden)]
    pub fn held(&self) -> impl Iterator<Item = (SocketAddr, &MembershipUpdate)> {
        self.latest.values().flat_map(|record| {
            record
                .identities
                .iter()
                .map(|((addr, _), held)| (*addr, &held.latest))
        })
    }

    /// The incarnation of the last SWIM fact the gate was told of `node`
    /// (a leave is told at it), if any.
    pub fn told_incarnation(&self, node: &NodeId) -> Option<u64> {
        self.latest.get(node)?.told
    }

    /// The facts held for the identity `node` signed (its newest
    /// generation, if it signs none).
    fn signed_held(&self, node: &NodeId) -> Option<&UnsignedFacts> {
        let signed = self.swim_addr.get(node)?;
        let record = self.latest.get(node)?;
        record.identities.get(&record.signed_key(*signed)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::live::swim::tracker::SwimFact;

    fn observed(state: SwimState, incarnation: u64) -> SwimFact {
        SwimFact {
            update: MembershipUpdate {
                node: NodeId::new("node-4").unwrap(),
                state,
                incarnation,
            },
            addr: SocketAddr::from(([10, 0, 0, 4], 7946)),
            replaced: false,
        }
    }

    #[test]
    fn a_suspicion_heard_before_the_first_frame_comes_after_the_alive_it_suspects() {
        // SWIM saw node-4 alive, then suspected it, all before node-4's
        // first frame signed its address: binding hands the gate both, in
        // order, so the suspicion counts (alone it would be a suspicion of
        // a member never seen, which the gate ignores as stale).
        let mut nodes = Nodes::default();
        assert_eq!(nodes.observe(observed(SwimState::Alive, 7)), Kept::Held);
        assert_eq!(nodes.observe(observed(SwimState::Suspect, 7)), Kept::Held);
        let node = NodeId::new("node-4").unwrap();
        let facts = nodes
            .bind(&node, SocketAddr::from(([10, 0, 0, 4], 7946)), None)
            .unwrap();
        let states: Vec<SwimState> = facts.iter().map(|f| f.state).collect();
        assert_eq!(states, vec![SwimState::Alive, SwimState::Suspect]);
        // Bound already: nothing again.
        assert!(nodes
            .bind(&node, SocketAddr::from(([10, 0, 0, 4], 7946)), None)
            .is_none());
    }

    fn at(state: SwimState, generation: u64, incarnation: u64) -> SwimFact {
        observed(state, (generation << 16) | incarnation)
    }

    fn node4() -> NodeId {
        NodeId::new("node-4").unwrap()
    }

    /// node-4 signing its address (and `generation`), seen alive at
    /// generation 5, incarnation 3: the table and what the gate was told.
    fn signed_alive(generation: Option<u64>) -> (Nodes, NodeId, SocketAddr, MembershipUpdate) {
        let (node, addr) = (node4(), SocketAddr::from(([10, 0, 0, 4], 7946)));
        let mut nodes = Nodes::default();
        nodes.bind(&node, addr, generation);
        let told = nodes
            .observe(at(SwimState::Alive, 5, 3))
            .for_gate()
            .unwrap();
        (nodes, node, addr, told)
    }

    #[test]
    fn an_identity_the_node_did_not_sign_can_neither_outrank_nor_kill_it() {
        // Issue 20: a forged identity at node-4's signed address with a
        // higher generation replaced node-4; then its suspicion and death
        // were node-4's, and node-4 was never ready again.
        let node = NodeId::new("node-4").unwrap();
        let addr = SocketAddr::from(([10, 0, 0, 4], 7946));
        let mut nodes = Nodes::default();
        assert_eq!(nodes.observe(at(SwimState::Alive, 5, 1)), Kept::Held);
        let facts = nodes.bind(&node, addr, Some(5)).unwrap();
        assert_eq!(facts.len(), 1);
        let forged = 5 + 1_000_000_000;
        for state in [SwimState::Alive, SwimState::Suspect, SwimState::Dead] {
            assert_eq!(
                nodes.observe(at(state, forged, 1)).for_gate(),
                None,
                "{state:?}"
            );
        }
        // foca's Rename of the signed identity by another at its address.
        let mut replaced = at(SwimState::Dead, 5, 1);
        replaced.replaced = true;
        assert_eq!(nodes.observe(replaced).for_gate(), None);
        // The node's own identity still counts, suspicion included.
        let suspect = nodes
            .observe(at(SwimState::Suspect, 5, 1))
            .for_gate()
            .unwrap();
        assert_eq!(suspect.state, SwimState::Suspect);
    }

    #[test]
    fn a_renewed_identity_counts_once_the_node_signs_it() {
        let node = NodeId::new("node-4").unwrap();
        let addr = SocketAddr::from(([10, 0, 0, 4], 7946));
        let mut nodes = Nodes::default();
        nodes.bind(&node, addr, Some(5));
        assert!(nodes
            .observe(at(SwimState::Alive, 5, 1))
            .for_gate()
            .is_some());
        // Declared down, the node rejoins at generation 6: held until signed.
        assert_eq!(nodes.observe(at(SwimState::Alive, 6, 0)), Kept::Held);
        let facts = nodes.bind(&node, addr, Some(6)).unwrap();
        assert_eq!(facts.len(), 1);
        assert_eq!(facts[0].incarnation, 6 << 16);
        assert_eq!(facts[0].state, SwimState::Alive);
    }

    #[test]
    fn a_leaving_node_is_told_left_at_what_was_last_told_of_the_identity_it_signed() {
        // The incarnation a leave is told at comes from the one table of
        // SWIM facts held here: the latest of the signed identity, never
        // a forged identity's, nor a fact held for a generation not signed.
        assert_eq!(Nodes::default().told_incarnation(&node4()), None);
        let (mut nodes, node, addr, _) = signed_alive(Some(5));
        assert_eq!(nodes.observe(at(SwimState::Alive, 9_999, 7)), Kept::Held);
        assert_eq!(nodes.told_incarnation(&node), Some((5 << 16) | 3));
        // Signed anew at generation 6: its own fact, once heard.
        assert_eq!(nodes.observe(at(SwimState::Alive, 6, 1)), Kept::Held);
        nodes.bind(&node, addr, Some(6));
        assert_eq!(nodes.told_incarnation(&node), Some((6 << 16) | 1));
        // A leaving node's SWIM `dead` is its `left`.
        nodes.leaving.insert(node.clone());
        let left = nodes.observe(at(SwimState::Dead, 6, 1)).for_gate().unwrap();
        assert_eq!(
            (left.state, left.incarnation),
            (SwimState::Left, (6 << 16) | 1)
        );
    }

    #[test]
    fn without_a_signed_generation_the_address_alone_binds() {
        let node = NodeId::new("node-4").unwrap();
        let addr = SocketAddr::from(([10, 0, 0, 4], 7946));
        let mut nodes = Nodes::default();
        nodes.bind(&node, addr, None);
        assert!(nodes
            .observe(at(SwimState::Alive, 5, 1))
            .for_gate()
            .is_some());
        assert!(nodes
            .observe(at(SwimState::Alive, 6, 0))
            .for_gate()
            .is_some());
    }

    /// A frame on connection `connection` from `peer`, in life 1.
    fn frame(
        connection: u64,
        peer: SocketAddr,
        identity: (Option<SocketAddr>, Option<u64>),
        heartbeat: std::time::Duration,
    ) -> FrameHeard {
        FrameHeard {
            connection,
            peer,
            life: 1,
            identity,
            heartbeat,
        }
    }

    #[test]
    fn a_first_frame_of_another_life_than_the_store_held_is_a_process_replaced_unheard() {
        // Design §9: the store held node-1's sequence in life 7 and
        // node-2's in life 3 when the term began.
        let (one, two, three) = (
            NodeId::new("node-1").unwrap(),
            NodeId::new("node-2").unwrap(),
            NodeId::new("node-3").unwrap(),
        );
        let mut nodes = Nodes::default();
        let counter = 1 << crate::live::wire::COUNTER_BITS;
        nodes.restore_sequences(
            [(one.clone(), 7 * counter + 41), (two.clone(), 3 * counter)]
                .into_iter()
                .collect(),
        );
        assert_eq!(nodes.last_seq[&one], 7 * counter + 41, "replay protection");
        let peer = SocketAddr::from(([10, 0, 0, 2], 40000));
        let in_life = |life| FrameHeard {
            life,
            ..frame(1, peer, (None, None), std::time::Duration::from_secs(1))
        };
        // The same process reconnected: its life.
        assert!(!nodes.replaced_since_stored(&one, &in_life(7)));
        // Only a node's first frame in the term answers: later lives are
        // told by `new_process`.
        assert!(!nodes.replaced_since_stored(&one, &in_life(8)));
        // Started again while nobody heard: another life.
        assert!(nodes.replaced_since_stored(&two, &in_life(5)));
        assert!(!nodes.replaced_since_stored(&two, &in_life(5)));
        // Nothing stored of a node: nothing to tell it from.
        assert!(!nodes.replaced_since_stored(&three, &in_life(1)));
    }

    /// node-2's SWIM address, and where its agent connects from.
    fn node2() -> (NodeId, SocketAddr, SocketAddr) {
        (
            NodeId::new("node-2").unwrap(),
            SocketAddr::from(([10, 0, 0, 2], 7946)),
            SocketAddr::from(([10, 0, 0, 2], 40000)),
        )
    }

    /// A frame of node-2 as its agent sends it: ready, signing SWIM
    /// generation `generation`, on connection `connection`, in the life
    /// of sequences `life`.
    fn ready_frame(generation: u64, connection: u64, life: u64) -> Frame {
        let (node, addr, peer) = node2();
        let announcement = Announcement {
            available: true,
            identity: Some(crate::live::wire::identity_text(b"data-plane key")),
            swim: Some(addr),
            generation: Some(generation),
            fault: None,
            leaving: false,
            heartbeat_ms: Some(1000),
            ask: None,
        };
        let accepted = Accepted {
            node,
            seq: (life << crate::live::wire::COUNTER_BITS) + 1,
            announcement,
            repeats: false,
            first: false,
            ask: None,
        };
        Frame {
            accepted,
            connection,
            peer,
        }
    }

    /// Where this orchestrator's own SWIM member answers (the tests'
    /// `own_swim`).
    fn own() -> SocketAddr {
        SocketAddr::from(([10, 0, 0, 1], 7946))
    }

    #[test]
    fn a_frame_comes_to_what_it_says_in_order_and_a_heartbeat_to_nothing() {
        // Design §8: one frame, one input, in order at one instant: the
        // SWIM facts held for the identity it newly signs, its identity
        // material, its fault or recovery, its availability; the member
        // is asked to join the address it signed. A heartbeat that
        // repeats the state comes to nothing but its acknowledgement.
        let (node, addr, _) = node2();
        let second = std::time::Duration::from_secs(1);
        let now = std::time::Instant::now();
        let mut nodes = Nodes::starting_now();
        let alive = MembershipUpdate {
            node: node.clone(),
            state: SwimState::Alive,
            incarnation: 7 << 16,
        };
        let heard = nodes.observe(SwimFact {
            update: alive.clone(),
            addr,
            replaced: false,
        });
        assert_eq!(heard, Kept::Held, "not signed yet");
        let taken = nodes.take_frame(ready_frame(7, 1, 1), now, second, own());
        let fingerprint = IdentityMaterial::new(b"data-plane key".to_vec())
            .unwrap()
            .fingerprint();
        assert_eq!(
            taken.observations,
            vec![
                alive.into_observation().1,
                Observation::Identity(fingerprint),
                Observation::Recovered,
                Observation::Available,
            ]
        );
        assert_eq!(taken.join, Some(addr));
        assert_eq!(
            (taken.superseded, taken.twin, taken.seq),
            (None, None, (1 << 20) + 1)
        );
        let mut heartbeat = ready_frame(7, 1, 1);
        heartbeat.accepted.repeats = true;
        let taken = nodes.take_frame(heartbeat, now, second, own());
        assert!(taken.observations.is_empty() && taken.join.is_none());
        // The same state on a new connection: the old one is superseded,
        // and the identity already bound asks nobody to join.
        let taken = nodes.take_frame(ready_frame(7, 2, 1), now, second, own());
        assert_eq!(taken.superseded, Some(1));
        assert_eq!(taken.join, None);
        assert_eq!(taken.observations.last(), Some(&Observation::Available));
    }

    #[test]
    fn a_replay_is_signed_elsewhere_only_while_another_open_connection_carried_the_last_frame() {
        let (node, _, _) = node2();
        let (second, now) = (std::time::Duration::from_secs(1), std::time::Instant::now());
        let mut nodes = Nodes::starting_now();
        // Nothing heard yet: a replay is nobody else's doing.
        assert!(!nodes.signed_elsewhere(&node, 1));
        // The real process on connection 1, then a copy on connection 2
        // (a later life, another SWIM generation) signing ahead of it.
        nodes.take_frame(ready_frame(7, 1, 7), now, second, own());
        nodes.take_frame(ready_frame(9, 2, 9), now, second, own());
        assert!(nodes.signed_elsewhere(&node, 1), "the copy holds the node");
        assert!(nodes.signed_elsewhere(&node, 3), "on any other connection");
        assert!(!nodes.signed_elsewhere(&node, 2), "not its own connection");
        // The copy stopped: its connection ended, and nobody holds it.
        nodes.connection_closed(&node, 2);
        assert!(!nodes.signed_elsewhere(&node, 1));
        assert!(!nodes.signed_elsewhere(&node, 3));
    }

    #[test]
    fn a_leaving_frame_is_the_nodes_own_left_at_what_the_gate_was_told() {
        let (node, addr, _) = node2();
        let (second, now) = (std::time::Duration::from_secs(1), std::time::Instant::now());
        let mut nodes = Nodes::starting_now();
        nodes.take_frame(ready_frame(7, 1, 1), now, second, own());
        let incarnation = (7 << 16) + 3;
        let told = nodes.observe(SwimFact {
            update: MembershipUpdate {
                node: node.clone(),
                state: SwimState::Alive,
                incarnation,
            },
            addr,
            replaced: false,
        });
        assert!(matches!(told, Kept::ForGate(_)));
        let mut leaving = ready_frame(7, 1, 1);
        leaving.accepted.announcement.leaving = true;
        let taken = nodes.take_frame(leaving, now, second, own());
        let tail = &taken.observations[taken.observations.len() - 4..];
        assert_eq!(
            tail,
            [
                Observation::Swim {
                    state: SwimState::Left,
                    incarnation
                },
                tail[1].clone(),
                Observation::Recovered,
                Observation::Unavailable,
            ]
        );
        assert!(matches!(tail[1], Observation::Identity(_)));
        // SWIM's `dead` of it from now on is its `left`.
        let dead = nodes.observe(SwimFact {
            update: MembershipUpdate {
                node,
                state: SwimState::Dead,
                incarnation: incarnation + 1,
            },
            addr,
            replaced: false,
        });
        assert!(matches!(dead, Kept::ForGate(u) if u.state == SwimState::Left));
    }

    #[test]
    fn a_renewed_identity_is_the_same_process_and_a_restarted_one_is_not() {
        // Design §11: a node's new generation counts as a new process
        // (unavailable until seen alive) only when it comes neither on the
        // connection nor in the life of sequences of the node's last frame.
        let second = std::time::Duration::from_secs(1);
        let start = std::time::Instant::now();
        let mut nodes = Nodes::default();
        let restarted = |nodes: &mut Nodes, frame: Frame| {
            let taken = nodes.take_frame(frame, start, second, own());
            taken.observations.first() == Some(&Observation::Unavailable)
        };
        assert!(
            !restarted(&mut nodes, ready_frame(100, 1, 7)),
            "the first signature"
        );
        assert!(
            !restarted(&mut nodes, ready_frame(100, 1, 7)),
            "a heartbeat"
        );
        // Renewed after SWIM declared it down: the same connection and life.
        assert!(!restarted(&mut nodes, ready_frame(101, 1, 7)));
        // Renewed, and reconnected (a takeover): the same life.
        assert!(!restarted(&mut nodes, ready_frame(102, 2, 7)));
        // Its counter wrapped into the next life, on the same connection.
        assert!(!restarted(&mut nodes, ready_frame(103, 2, 8)));
        // Restarted: a new connection, a new life, however soon.
        assert!(restarted(&mut nodes, ready_frame(200, 3, 9)));
        // Its frames after that are that process's.
        assert!(!restarted(&mut nodes, ready_frame(200, 3, 9)));
        // An agent that signs no generation never names a new process.
        let mut unsigned = ready_frame(0, 4, 10);
        unsigned.accepted.announcement.generation = None;
        assert!(!restarted(&mut nodes, unsigned));
    }

    #[test]
    fn a_question_about_this_orchestrators_own_member_is_answered_alive() {
        // A node's probe of the orchestrator's member went unanswered over
        // UDP: the orchestrator answering says it lives. An impostor's
        // name at that address, or another address, is not it.
        let (second, now) = (std::time::Duration::from_secs(1), std::time::Instant::now());
        let mut nodes = Nodes::default();
        let asking = |name: &str, swim: SocketAddr| {
            let mut frame = ready_frame(7, 1, 1);
            frame.accepted.ask = Some(Box::new(crate::live::wire::Ask {
                node: name.into(),
                swim,
                generation: 1,
                probe: 3,
            }));
            frame
        };
        let orchestrator = super::super::swim::member::ORCHESTRATOR;
        let answer = |nodes: &mut Nodes, frame| {
            let vouch = nodes.take_frame(frame, now, second, own()).vouch.unwrap();
            assert_eq!(vouch.ask.probe, 3, "the probe named back");
            vouch.alive
        };
        assert!(answer(&mut nodes, asking(orchestrator, own())));
        let elsewhere = SocketAddr::from(([10, 0, 0, 9], 7946));
        assert!(!answer(&mut nodes, asking(orchestrator, elsewhere)));
        assert!(!answer(&mut nodes, asking("node-9", own())));
    }

    #[test]
    fn an_orchestrator_hearing_nobody_since_a_node_was_due_doubts_itself() {
        // Cut off, it would accuse every node, and the news, once healed,
        // would make every node renew. A node is accused only when another
        // spoke after its own frame was due; one silent among live ones is
        // accused, every one silent at once is not.
        let heartbeat = std::time::Duration::from_millis(500);
        let ms = std::time::Duration::from_millis;
        let start = std::time::Instant::now();
        let mut nodes = Nodes::default();
        let member = |i: u8| crate::live::swim::SwimIdentity {
            node: format!("node-{i}"),
            addr: SocketAddr::from(([10, 0, 0, i], 7946)),
            generation: 5,
        };
        let hear = |nodes: &mut Nodes, i: u8, at| {
            let node = NodeId::new(&format!("node-{i}")).unwrap();
            let peer = SocketAddr::from(([10, 0, 0, i], 40000));
            let identity = (Some(member(i).addr), Some(5));
            nodes.heard_from(
                &node,
                frame(u64::from(i), peer, identity, heartbeat),
                at,
                heartbeat * 4,
            );
            nodes.attached.insert(node, u64::from(i));
        };
        for i in 1..=3 {
            hear(&mut nodes, i, start);
        }
        let silent = start + heartbeat + VOUCH_SLACK + ms(1);
        // node-2 and node-3 still speak: node-1 alone went silent.
        hear(&mut nodes, 2, silent);
        hear(&mut nodes, 3, silent);
        assert!(!nodes.vouches(&member(1), silent));
        assert!(nodes.vouches(&member(2), silent));
        // Then every connection went silent at once: the fault is likelier here.
        let later = silent + heartbeat + VOUCH_SLACK + ms(1);
        for i in 2..=3 {
            assert!(nodes.vouches(&member(i), later), "node-{i}");
        }
        // node-1 went silent first, while the others spoke: still accused.
        assert!(!nodes.vouches(&member(1), later));
        // The operator's trial: the cut comes between heartbeats, so when
        // the probe of node-2 goes unanswered its frame is 0.9 s old and
        // node-3's only 0.56 s (still fresh). Nobody spoke after node-2
        // was due: not its own silence.
        let cut = later + ms(100);
        hear(&mut nodes, 2, cut - ms(388));
        hear(&mut nodes, 3, cut - ms(39));
        let probed = cut + ms(517);
        assert!(nodes.vouches(&member(2), probed));
        // Connections closed since (for their silence, or by their peer)
        // change nothing: a node accused is one that went silent while
        // another spoke.
        for i in [2u8, 3] {
            nodes
                .attached
                .remove(&NodeId::new(&format!("node-{i}")).unwrap());
        }
        let closed = cut + heartbeat * 5;
        assert!(nodes.vouches(&member(2), closed));
        assert!(nodes.vouches(&member(3), closed));
        // node-3 speaks again, past node-2's due: node-2's silence is its own.
        hear(&mut nodes, 3, closed);
        assert!(!nodes.vouches(&member(2), closed));
        // An identity the node did not sign is vouched for only when
        // nobody is heard at all.
        let impostor = crate::live::swim::SwimIdentity {
            generation: 9,
            ..member(3)
        };
        assert!(!nodes.vouches(&impostor, closed));
        assert!(nodes.vouches(&impostor, closed + heartbeat * 2));
        // One node heard in all: nothing to compare with.
        let mut alone = Nodes::default();
        hear(&mut alone, 1, start);
        assert!(!alone.vouches(&member(1), start + heartbeat * 3));
    }

    #[test]
    fn silence_is_held_back_only_among_replicas_whose_term_is_in_doubt_and_every_connection_silent()
    {
        let heartbeat = std::time::Duration::from_millis(500);
        let start = std::time::Instant::now();
        let mut nodes = Nodes::default();
        for i in 1..=2u8 {
            let node = NodeId::new(&format!("node-{i}")).unwrap();
            let peer = SocketAddr::from(([10, 0, 0, i], 40000));
            let identity = (Some(SocketAddr::from(([10, 0, 0, i], 7946))), Some(5));
            nodes.heard_from(
                &node,
                frame(u64::from(i), peer, identity, heartbeat),
                start,
                heartbeat * 4,
            );
            nodes.attached.insert(node, u64::from(i));
        }
        let silent = start + heartbeat * 4;
        // Alone: never (nothing tells its own cut from the nodes').
        assert!(!nodes.holds_back_silence(silent));
        let doubt = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let seen = std::sync::Arc::clone(&doubt);
        nodes.term_in_doubt = TermInDoubt(Some(std::sync::Arc::new(move || {
            seen.load(std::sync::atomic::Ordering::Relaxed)
        })));
        // A replica whose lease renews: the nodes are gone, not it.
        assert!(!nodes.holds_back_silence(silent));
        doubt.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(nodes.holds_back_silence(silent));
        // One connection that speaks: the others are really silent.
        assert!(!nodes.holds_back_silence(start));
    }

    #[test]
    fn frames_of_one_node_on_two_live_connections_are_told_apart_from_a_reconnect() {
        let node = NodeId::new("node-4").unwrap();
        let (a, b) = (
            SocketAddr::from(([10, 0, 0, 4], 40000)),
            SocketAddr::from(([10, 0, 0, 9], 40000)),
        );
        let within = std::time::Duration::from_secs(1);
        let start = std::time::Instant::now();
        let (one, two) = ((Some(a), Some(5)), (Some(b), Some(7)));
        let mut nodes = Nodes::default();
        // As the listener does: each accepted frame's connection attached.
        let heard = |nodes: &mut Nodes, id: u64, peer, identity, at| {
            let twin = nodes.heard_from(&node, frame(id, peer, identity, within), at, within);
            nodes.attached.insert(node.clone(), id);
            twin
        };
        assert_eq!(heard(&mut nodes, 1, a, one, start), None);
        let half = start + within / 2;
        assert_eq!(heard(&mut nodes, 1, a, one, half), None);
        // The same process on a second connection: one identity.
        assert_eq!(heard(&mut nodes, 2, a, one, half), None);
        // Another identity while the first still speaks: two signers.
        let soon = half + std::time::Duration::from_millis(10);
        assert_eq!(heard(&mut nodes, 3, b, two, soon), Some(a));
        // A restart after the first went quiet is not.
        let later = soon + within * 2;
        assert_eq!(heard(&mut nodes, 4, a, one, later), None);
        // Nor one at once after the earlier connection closed (a process
        // killed and started again, or stopped after saying it leaves:
        // its new generation on a new one), though the closed connection
        // stays attached (the lost-connection grace, or for good after
        // `leaving`). An operator's trial: every quick restart raised the
        // alarm.
        nodes.connection_closed(&node, 4);
        let again = later + std::time::Duration::from_millis(10);
        assert_eq!(heard(&mut nodes, 5, a, (Some(a), Some(6)), again), None);
        // Closing another connection than the last heard changes nothing:
        // a second signer on a third connection while 5 speaks.
        nodes.connection_closed(&node, 4);
        let soon = again + std::time::Duration::from_millis(10);
        assert_eq!(heard(&mut nodes, 6, b, two, soon), Some(a));
    }

    #[test]
    fn a_member_is_vouched_for_only_by_its_own_fresh_frames_on_its_live_connection() {
        let node = NodeId::new("node-4").unwrap();
        let addr = SocketAddr::from(([10, 0, 0, 4], 7946));
        let probed = crate::live::swim::SwimIdentity {
            node: "node-4".into(),
            addr,
            generation: 5,
        };
        let heartbeat = std::time::Duration::from_millis(500);
        let start = std::time::Instant::now();
        let mut nodes = Nodes::default();
        assert!(!nodes.vouches(&probed, start), "never heard");
        let peer = SocketAddr::from(([10, 0, 0, 4], 40000));
        // A frame of node-4 signing `probed` on connection 1, at `start`.
        let hear = |nodes: &mut Nodes, heartbeat: std::time::Duration| {
            let signed = frame(1, peer, (Some(addr), Some(5)), heartbeat);
            nodes.heard_from(&node, signed, start, heartbeat * 4);
        };
        hear(&mut nodes, heartbeat);
        assert!(!nodes.vouches(&probed, start), "no connection attached");
        nodes.attached.insert(node.clone(), 1);
        assert!(nodes.vouches(&probed, start));
        // A heartbeat late by the slack still vouches; later, not.
        assert!(nodes.vouches(&probed, start + heartbeat + VOUCH_SLACK));
        let late = start + heartbeat + VOUCH_SLACK + std::time::Duration::from_millis(1);
        assert!(!nodes.vouches(&probed, late), "the frames stopped");
        // Not heard from in a term that just began: vouched for a while.
        let unheard = crate::live::swim::SwimIdentity {
            node: "node-9".into(),
            ..probed.clone()
        };
        assert!(!nodes.vouches(&unheard, start), "no term");
        nodes.term_started = Some(start);
        assert!(nodes.vouches(&unheard, start + TERM_GRACE / 2));
        assert!(!nodes.vouches(&unheard, start + TERM_GRACE));
        // A node with a long heartbeat is vouched for within the limit only.
        let slow = std::time::Duration::from_secs(10);
        hear(&mut nodes, slow);
        let past_limit = start + VOUCH_HEARTBEAT_LIMIT + VOUCH_SLACK;
        assert!(nodes.vouches(&probed, past_limit));
        let later = past_limit + std::time::Duration::from_millis(1);
        assert!(
            !nodes.vouches(&probed, later),
            "a frozen node with a 10 s heartbeat"
        );
        hear(&mut nodes, heartbeat);
        // Another identity at the address (an impostor, an older life).
        for other in [6, 4] {
            let impostor = crate::live::swim::SwimIdentity {
                generation: other,
                ..probed.clone()
            };
            assert!(!nodes.vouches(&impostor, start));
        }
        // The frames came on a connection since replaced, or closed.
        nodes.attached.insert(node.clone(), 2);
        assert!(!nodes.vouches(&probed, start));
        nodes.attached.remove(&node);
        assert!(!nodes.vouches(&probed, start));
    }

    #[test]
    fn facts_kept_per_node_are_bounded_evicting_the_oldest_generation() {
        let node = NodeId::new("node-4").unwrap();
        let mut nodes = Nodes::default();
        for generation in 0..1_000 {
            nodes.observe(at(SwimState::Alive, generation, 0));
        }
        let held = &nodes.latest[&node].identities;
        assert_eq!(held.len(), ADDRESSES_PER_NODE);
        assert!(held
            .keys()
            .all(|(_, g)| *g >= 1_000 - ADDRESSES_PER_NODE as u64));
    }

    /// Whether a gate holding `told` of the node applies a `left` at
    /// `incarnation` (design §1: one at a lower incarnation is stale).
    fn gate_admits_left(told: &MembershipUpdate, incarnation: u64) -> bool {
        poolgate_actors::core::Membership::Seen {
            state: told.state,
            incarnation: told.incarnation,
        }
        .admits(SwimState::Left, incarnation)
    }

    /// As the orchestrator tells a leave.
    fn left_at(nodes: &Nodes, node: &NodeId) -> u64 {
        nodes.told_incarnation(node).unwrap_or(0)
    }

    /// Eight members calling themselves node-4 at other addresses, at
    /// later generations: none of it for the gate.
    fn invent_eight(nodes: &mut Nodes) {
        for i in 0..8u8 {
            let mut fake = at(SwimState::Alive, 1_000 + u64::from(i), 0);
            fake.addr = SocketAddr::from(([10, 0, 9, i], 7946));
            assert_eq!(nodes.observe(fake).for_gate(), None, "impostor {i}");
        }
    }

    #[test]
    fn a_leave_is_not_made_stale_by_identities_an_insider_invents_elsewhere() {
        // Adversary finding: eight members calling themselves node-4 at
        // other addresses evicted the signed identity's facts, and its
        // leave was told at 0, stale for the gate (design §7: it sees left).
        let (mut nodes, node, _, told) = signed_alive(Some(5));
        invent_eight(&mut nodes);
        assert!(gate_admits_left(&told, left_at(&nodes, &node)));
        // The signed identity's facts are still held: a repeat stops here.
        assert_eq!(nodes.observe(at(SwimState::Alive, 5, 3)), Kept::Repeat);
    }

    #[test]
    fn a_leave_signed_at_a_generation_swim_has_not_heard_of_yet_is_not_stale() {
        // Adversary finding: restarted at generation 6, the node's first
        // frame says it leaves before SWIM here heard of generation 6.
        let (mut nodes, node, addr, told) = signed_alive(Some(5));
        assert_eq!(nodes.bind(&node, addr, Some(6)), Some(vec![]));
        assert!(gate_admits_left(&told, left_at(&nodes, &node)));
    }

    #[test]
    fn a_replaced_node_that_signs_no_generation_is_told_dead_whatever_impostors_invent() {
        // Adversary finding: the Rename of a node signing no generation
        // was dropped once invented identities had evicted its facts.
        let (mut nodes, ..) = signed_alive(None);
        invent_eight(&mut nodes);
        // foca's Rename, as the tracker gives it: dead at the floor of
        // the generation, raised to what was held.
        let mut replaced = at(SwimState::Dead, 5, 0);
        replaced.replaced = true;
        let dead = nodes.observe(replaced).for_gate().unwrap();
        assert_eq!(
            (dead.state, dead.incarnation),
            (SwimState::Dead, (5 << 16) | 3)
        );
    }
}
