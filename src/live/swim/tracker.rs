//! foca's membership changes → the gate's SWIM observations.
//!
//! foca reports members as alive, suspect or down, each with a 16-bit
//! incarnation per identity. The gate wants one state and one incarnation
//! per node that only grows: the tracker folds the generation into the high
//! bits (`generation << 16 | incarnation`), so a restarted node (a new
//! generation: its boot time in unix milliseconds, below 2^48) outranks
//! everything its previous life said. A generation of 2^48 or more would
//! lose bits in that fold: such a member is ignored (and logged).
//!
//! foca's `Down` becomes `dead`: foca reports a graceful leave and a
//! confirmed failure the same way; the orchestrator tells them apart by the
//! node's own word (it announces that it is leaving). A member foca
//! replaces by another identity at its address (foca's `Rename`) is
//! reported `dead` at the incarnation last reported, so it cannot stay
//! "alive" in the gate.
//!
//! The tracker is fed what changed during one foca call (see
//! [`super::watch`]), so its cost is in proportion to the change, not to
//! the cluster: it never walks foca's whole membership.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;

use foca::{Member, State};
use poolgate_actors::core::{MembershipUpdate, NodeId, SwimState};

use super::identity::SwimIdentity;

/// Generations must stay below this to fold into an incarnation.
pub const GENERATION_LIMIT: u64 = 1 << 48;

/// One change of a member as seen from here: the update for the gate, and
/// the SWIM address of the member it is about (facts about node N count
/// only from the address N signed; the orchestrator checks that).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SwimFact {
    /// The membership fact.
    pub update: MembershipUpdate,
    /// Where the member that says so answers.
    pub addr: SocketAddr,
    /// The member is reported dead because another identity took its
    /// address (foca's `Rename`), not because SWIM found it gone.
    pub replaced: bool,
}

/// The latest state reported per member, by address then node name (a
/// name is looked up as `&str`, without building a key, and in constant
/// time however many names share an address), to emit only changes.
/// With [`MembershipTracker::only`], members of other names are not kept
/// at all: invented members cost nothing here.
#[derive(Debug, Default)]
pub struct MembershipTracker {
    reported: HashMap<SocketAddr, HashMap<String, (SwimState, u64)>>,
    only: Option<HashSet<String>>,
}

/// Below this many states in one call, repeats are found by scanning.
const SCAN_BELOW: usize = 8;

/// A member state as the gate counts it: state and folded incarnation.
fn fold(member: &Member<SwimIdentity>) -> (SwimState, u64) {
    let state = match member.state() {
        State::Alive => SwimState::Alive,
        State::Suspect => SwimState::Suspect,
        State::Down => SwimState::Dead,
    };
    let id = member.id();
    (
        state,
        (id.generation << 16) | u64::from(member.incarnation()),
    )
}

impl MembershipTracker {
    /// Keeps and reports only members named in `names` (the orchestrator's
    /// registry: a fact about any other name could never count).
    pub fn only(&mut self, names: HashSet<String>) {
        self.reported.retain(|_, at| {
            at.retain(|name, _| names.contains(name));
            !at.is_empty()
        });
        self.only = Some(names);
    }

    /// Forgets what was reported: the next [`MembershipTracker::changed`]
    /// reports every member again (a new sink starts from the whole view).
    pub fn forget_reported(&mut self) {
        self.reported.clear();
    }

    fn wanted(&self, node: &str) -> bool {
        self.only.as_ref().is_none_or(|names| names.contains(node))
    }

    /// Turns what one foca call changed into one update per member whose
    /// state or incarnation differs from what was reported: `states` are
    /// member states as foca applied them, oldest first (a member may
    /// appear more than once; its last state counts); `replaced` are the
    /// identities foca dropped for a newer one at their address (its
    /// `Rename(old, new)` notifications). Members are told apart by name
    /// and address: another member calling itself N from elsewhere is
    /// reported separately, never in N's place. Updates come sorted by
    /// node and address. The cost is in proportion to `states`.
    pub fn changed(
        &mut self,
        states: impl IntoIterator<Item = Member<SwimIdentity>>,
        replaced: impl IntoIterator<Item = (SwimIdentity, SwimIdentity)>,
    ) -> Vec<SwimFact> {
        let states: Vec<Member<SwimIdentity>> = states.into_iter().collect();
        let mut done = Done::new(states.len());
        let mut updates = Vec::new();
        let replaced: Vec<(SwimIdentity, SwimIdentity)> = replaced.into_iter().collect();
        for (old, new) in &replaced {
            if (&old.node, old.addr) == (&new.node, new.addr) {
                continue; // the same member at a new generation: its state says it
            }
            let key = (old.node.as_str(), old.addr);
            if !self.wanted(key.0) || !done.insert(key) {
                continue;
            }
            // Gone: dead at the incarnation last known for it.
            let latest = states
                .iter()
                .rev()
                .find(|m| (m.id().node.as_str(), m.id().addr) == key)
                .map(fold)
                .or_else(|| self.last_reported(key.0, key.1));
            if let Some((_, incarnation)) = latest {
                let dead = (SwimState::Dead, incarnation);
                self.report(key.0, key.1, dead, true, &mut updates);
            }
        }
        for member in states.iter().rev() {
            let id = member.id();
            if !self.wanted(&id.node) || !done.insert((id.node.as_str(), id.addr)) {
                continue; // not wanted, or a later state of it was taken
            }
            if id.generation >= GENERATION_LIMIT {
                tracing::warn!(member = %id.node, "a SWIM member's generation is 2^48 or more; ignored");
                continue;
            }
            self.report(&id.node, id.addr, fold(member), false, &mut updates);
        }
        updates.sort_by(|a, b| (&a.update.node, a.addr).cmp(&(&b.update.node, b.addr)));
        updates
    }

    fn last_reported(&self, node: &str, addr: SocketAddr) -> Option<(SwimState, u64)> {
        self.reported.get(&addr)?.get(node).copied()
    }

    fn report(
        &mut self,
        node: &str,
        addr: SocketAddr,
        now: (SwimState, u64),
        replaced: bool,
        updates: &mut Vec<SwimFact>,
    ) {
        let at = self.reported.entry(addr).or_default();
        match at.get_mut(node) {
            Some(known) if *known == now => return,
            Some(known) => *known = now,
            None => {
                at.insert(node.to_string(), now);
            }
        }
        let Ok(node_id) = NodeId::new(node) else {
            // Noted once per change of the member; never reported.
            tracing::warn!(
                member = node,
                "a SWIM member's name is not a valid node id; ignored"
            );
            return;
        };
        let (state, incarnation) = now;
        updates.push(SwimFact {
            update: MembershipUpdate {
                node: node_id,
                state,
                incarnation,
            },
            addr,
            replaced,
        });
    }

    /// What was last reported per member (name, address): state and
    /// folded incarnation.
    pub fn reported(&self) -> impl Iterator<Item = (&str, SocketAddr, SwimState, u64)> {
        self.reported.iter().flat_map(|(addr, names)| {
            names
                .iter()
                .map(move |(node, state)| (node.as_str(), *addr, state.0, state.1))
        })
    }
}

/// The members already handled in one call: a scan for the usual handful,
/// a set beyond.
enum Done<'a> {
    Few(Vec<(&'a str, SocketAddr)>),
    Many(HashSet<(&'a str, SocketAddr)>),
}

impl<'a> Done<'a> {
    fn new(states: usize) -> Self {
        if states < SCAN_BELOW {
            Done::Few(Vec::with_capacity(states))
        } else {
            Done::Many(HashSet::with_capacity(states))
        }
    }

    /// Whether `key` is new (and now handled).
    fn insert(&mut self, key: (&'a str, SocketAddr)) -> bool {
        match self {
            Done::Few(keys) if keys.contains(&key) => false,
            Done::Few(keys) => {
                keys.push(key);
                true
            }
            Done::Many(keys) => keys.insert(key),
        }
    }
}

#[cfg(test)]
mod tests {
    //! foca instances wired together in memory, on a virtual millisecond
    //! clock: deterministic, no sockets.

    use std::cmp::Reverse;
    use std::collections::{BinaryHeap, VecDeque};
    use std::net::SocketAddr;

    use foca::{AccumulatingRuntime, Foca, NoCustomBroadcast, Timer};
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    use super::*;
    use crate::live::swim::drive;
    use crate::live::swim::watch::{Changes, WatchingCodec};
    use crate::live::swim::SwimSettings;

    type SimFoca = Foca<SwimIdentity, WatchingCodec, StdRng, NoCustomBroadcast>;

    struct SimNode {
        foca: SimFoca,
        runtime: AccumulatingRuntime<SwimIdentity>,
        up: bool,
    }

    /// A timer due: (at ms, sequence, member index, timer).
    type Due = (u64, u64, usize, Timer<SwimIdentity>);

    struct Sim {
        now: u64,
        seq: u64,
        nodes: Vec<SimNode>,
        timers: BinaryHeap<Reverse<Due>>,
        wire: VecDeque<(usize, Vec<u8>)>,
        tracker: MembershipTracker,
        /// What member 0's foca encoded.
        changes: Changes,
        seen: Vec<MembershipUpdate>,
    }

    fn addr(i: usize) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], 7000 + i as u16))
    }

    /// Member `from`'s requests, queued in the simulation's virtual time.
    struct Queues<'a> {
        from: usize,
        now: u64,
        seq: &'a mut u64,
        wire: &'a mut VecDeque<(usize, Vec<u8>)>,
        timers: &'a mut BinaryHeap<Reverse<Due>>,
    }

    impl drive::Host for Queues<'_> {
        fn send(&mut self, to: SwimIdentity, data: bytes::Bytes) {
            let index = (to.addr.port() - 7000) as usize;
            self.wire.push_back((index, data.to_vec()));
        }

        fn schedule(&mut self, after: std::time::Duration, timer: Timer<SwimIdentity>) {
            *self.seq += 1;
            let at = self.now + after.as_millis() as u64;
            self.timers.push(Reverse((at, *self.seq, self.from, timer)));
        }
    }

    fn new_foca(i: usize, generation: u64, codec: WatchingCodec) -> SimFoca {
        let identity = SwimIdentity {
            node: format!("n{i}"),
            addr: addr(i),
            generation,
        };
        let config = SwimSettings::default().foca_config(4);
        Foca::new(
            identity,
            config,
            StdRng::seed_from_u64(i as u64 * 31 + generation),
            codec,
        )
    }

    impl Sim {
        /// `n` members, each announcing itself to member 0.
        fn new(n: usize) -> Self {
            let (codec, changes) = WatchingCodec::watched();
            let mut codec = Some(codec);
            let mut sim = Sim {
                now: 0,
                seq: 0,
                nodes: (0..n)
                    .map(|i| SimNode {
                        foca: new_foca(i, 0, codec.take().unwrap_or_else(WatchingCodec::unwatched)),
                        runtime: AccumulatingRuntime::new(),
                        up: true,
                    })
                    .collect(),
                timers: BinaryHeap::new(),
                wire: VecDeque::new(),
                tracker: MembershipTracker::default(),
                changes,
                seen: Vec::new(),
            };
            for i in 1..n {
                sim.announce(i);
            }
            sim
        }

        fn announce(&mut self, i: usize) {
            let node = &mut self.nodes[i];
            node.foca
                .announce(SwimIdentity::seed(addr(0)), &mut node.runtime)
                .unwrap();
            self.settle(i);
        }

        /// Takes what node `i` asked for, delivers datagrams at once, and
        /// lets member 0's tracker look at the result.
        fn settle(&mut self, i: usize) {
            let mut queues = Queues {
                from: i,
                now: self.now,
                seq: &mut self.seq,
                wire: &mut self.wire,
                timers: &mut self.timers,
            };
            let replaced = drive::drain(&mut self.nodes[i].runtime, &mut queues);
            if i == 0 {
                let own = self.nodes[0].foca.identity().clone();
                let updates = drive::track(&mut self.tracker, &self.changes, &own, replaced);
                self.seen.extend(updates.into_iter().map(|o| o.update));
                self.check_against_the_whole_view();
            }
            while let Some((to, data)) = self.wire.pop_front() {
                if self.nodes[to].up && self.nodes[i].up {
                    let target = &mut self.nodes[to];
                    let _ = target.foca.handle_data(&data, &mut target.runtime);
                    self.settle(to);
                }
            }
        }

        /// The tracker, fed only changes, agrees with member 0's whole
        /// view: every member foca lists is reported in its state, and a
        /// member foca no longer lists was last reported dead.
        fn check_against_the_whole_view(&self) {
            let mut view = HashMap::new();
            for member in self.nodes[0].foca.iter_membership_state() {
                let id = member.id();
                let state = match member.state() {
                    State::Alive => SwimState::Alive,
                    State::Suspect => SwimState::Suspect,
                    State::Down => SwimState::Dead,
                };
                let incarnation = (id.generation << 16) | u64::from(member.incarnation());
                view.insert((id.node.clone(), id.addr), (state, incarnation));
            }
            for (node, addr, state, incarnation) in self.tracker.reported() {
                match view.remove(&(node.to_string(), addr)) {
                    Some(listed) => assert_eq!(listed, (state, incarnation), "{node}@{addr}"),
                    None => assert_eq!(state, SwimState::Dead, "{node}@{addr} vanished"),
                }
            }
            assert!(view.is_empty(), "never reported: {view:?}");
        }

        fn run_until(&mut self, until: u64) {
            while let Some(Reverse((at, _, _, _))) = self.timers.peek() {
                if *at > until {
                    break;
                }
                let Reverse((at, _, i, timer)) = self.timers.pop().unwrap();
                self.now = at;
                if self.nodes[i].up {
                    let node = &mut self.nodes[i];
                    let _ = node.foca.handle_timer(timer, &mut node.runtime);
                    self.settle(i);
                }
            }
            self.now = until;
        }

        /// Runs until member 0 has reported `node` in `state` (counting
        /// from the `since`-th report); returns that update.
        fn until_reported(
            &mut self,
            since: usize,
            node: &str,
            state: SwimState,
            limit: u64,
        ) -> MembershipUpdate {
            let start = since;
            while self.now < limit {
                if let Some(found) = self.seen[start..]
                    .iter()
                    .find(|u| u.node.as_str() == node && u.state == state)
                {
                    return found.clone();
                }
                let step = self.now + 10;
                self.run_until(step);
            }
            panic!(
                "{node} never reported {state} by {limit} ms: {:?}",
                self.seen
            );
        }
    }

    #[test]
    fn members_that_join_are_reported_alive() {
        let mut sim = Sim::new(3);
        let update = sim.until_reported(0, "n2", SwimState::Alive, 2_000);
        assert_eq!(update.incarnation, 0);
    }

    #[test]
    fn a_crashed_member_is_reported_suspect_at_its_incarnation_then_dead() {
        let mut sim = Sim::new(4);
        sim.run_until(3_000);
        sim.nodes[2].up = false;
        let since = sim.seen.len();
        let suspect = sim.until_reported(since, "n2", SwimState::Suspect, 10_000);
        assert_eq!(suspect.incarnation, 0);
        let dead = sim.until_reported(since, "n2", SwimState::Dead, 20_000);
        assert_eq!(dead.incarnation, 0);
    }

    #[test]
    fn a_refuted_suspicion_is_reported_alive_at_a_higher_incarnation() {
        let mut sim = Sim::new(4);
        sim.run_until(3_000);
        sim.nodes[2].up = false;
        let since = sim.seen.len();
        sim.until_reported(since, "n2", SwimState::Suspect, 10_000);
        sim.nodes[2].up = true;
        let since = sim.seen.len();
        let alive = sim.until_reported(since, "n2", SwimState::Alive, 20_000);
        assert!(alive.incarnation > 0, "{alive:?}");
    }

    #[test]
    fn a_restarted_member_with_a_new_generation_is_alive_again() {
        let mut sim = Sim::new(4);
        sim.run_until(3_000);
        sim.nodes[2].up = false;
        let since = sim.seen.len();
        let dead = sim.until_reported(since, "n2", SwimState::Dead, 30_000);
        let since = sim.seen.len();
        sim.nodes[2] = SimNode {
            foca: new_foca(2, 1, WatchingCodec::unwatched()),
            runtime: AccumulatingRuntime::new(),
            up: true,
        };
        sim.announce(2);
        let alive = sim.until_reported(since, "n2", SwimState::Alive, sim.now + 10_000);
        assert!(alive.incarnation >= 1 << 16, "{alive:?}");
        assert!(alive.incarnation > dead.incarnation);
    }

    #[test]
    fn only_changes_are_reported() {
        let mut sim = Sim::new(3);
        sim.run_until(5_000);
        let alive: Vec<_> = sim
            .seen
            .iter()
            .filter(|u| u.node.as_str() == "n1")
            .collect();
        assert_eq!(alive.len(), 1, "{:?}", sim.seen);
    }

    fn member(node: &str, generation: u64, state: State) -> Member<SwimIdentity> {
        let id = SwimIdentity {
            node: node.to_string(),
            addr: addr(1),
            generation,
        };
        Member::new(id, 0, state)
    }

    fn none() -> Vec<(SwimIdentity, SwimIdentity)> {
        Vec::new()
    }

    #[test]
    fn a_member_replaced_at_its_address_by_another_name_is_reported_dead() {
        let mut tracker = MembershipTracker::default();
        let alive = member("n1", 5, State::Alive);
        assert_eq!(tracker.changed([alive.clone()], none()).len(), 1);
        let other = member("n9", 6, State::Alive);
        let renamed = (alive.id().clone(), other.id().clone());
        let seen = tracker.changed([other], [renamed.clone()]);
        assert_eq!(seen.len(), 2, "{seen:?}");
        assert_eq!(seen[0].update.node.as_str(), "n1");
        assert_eq!(seen[0].update.state, SwimState::Dead);
        assert_eq!(seen[0].update.incarnation, 5 << 16);
        assert!(seen[0].replaced, "dead by replacement, so marked");
        assert_eq!(seen[1].update.node.as_str(), "n9");
        assert!(!seen[1].replaced);
        assert!(tracker.changed([], [renamed]).is_empty(), "reported once");
    }

    #[test]
    fn made_up_members_are_neither_kept_nor_reported_when_only_registry_names_are_wanted() {
        // Issue 20: 100,000 invented names grew the orchestrator for good.
        let mut tracker = MembershipTracker::default();
        tracker.only(["n1".to_string()].into_iter().collect());
        let invented: Vec<_> = (0..100_000)
            .map(|i| member(&format!("made-up-{i}"), 1, State::Alive))
            .collect();
        assert!(tracker.changed(invented, none()).is_empty());
        assert_eq!(tracker.reported().count(), 0);
        let seen = tracker.changed([member("n1", 1, State::Alive)], none());
        assert_eq!(seen.len(), 1);
        assert_eq!(tracker.reported().count(), 1);
    }

    #[test]
    fn many_names_at_one_address_are_told_apart_and_repeats_not_reported() {
        let mut tracker = MembershipTracker::default();
        let names: Vec<_> = (0..20_000)
            .map(|i| member(&format!("n{i}"), 1, State::Alive))
            .collect();
        assert_eq!(tracker.changed(names.clone(), none()).len(), 20_000);
        // Each found by its name (a hash lookup since issue 20, not a scan).
        assert!(tracker.changed(names, none()).is_empty());
    }

    #[test]
    fn a_member_noted_twice_in_one_call_is_reported_in_its_last_state() {
        let mut tracker = MembershipTracker::default();
        let seen = tracker.changed(
            [
                member("n1", 1, State::Alive),
                member("n1", 1, State::Suspect),
            ],
            none(),
        );
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].update.state, SwimState::Suspect);
        let again = tracker.changed([member("n1", 1, State::Suspect)], none());
        assert!(again.is_empty(), "a repeated state is no change");
    }

    #[test]
    fn a_generation_that_would_lose_bits_is_ignored() {
        let mut tracker = MembershipTracker::default();
        let members = [member("n1", GENERATION_LIMIT, State::Alive)];
        assert!(tracker.changed(members, none()).is_empty());
        let members = [member("n1", GENERATION_LIMIT - 1, State::Alive)];
        let update = tracker.changed(members, none());
        assert_eq!(update[0].update.incarnation, (GENERATION_LIMIT - 1) << 16);
    }

    #[test]
    fn another_member_calling_itself_n1_elsewhere_is_reported_apart_not_in_its_place() {
        let mut tracker = MembershipTracker::default();
        let real = member("n1", 5, State::Alive);
        let mut impostor = member("n1", 9, State::Alive);
        impostor = Member::new(
            SwimIdentity {
                addr: addr(2),
                ..impostor.id().clone()
            },
            0,
            State::Alive,
        );
        let both = [real.clone(), impostor.clone()];
        let seen = tracker.changed(both, none());
        assert_eq!(seen.len(), 2);
        // The real member goes down: that is reported, whatever the other says.
        let down = Member::new(real.id().clone(), 0, State::Down);
        let seen = tracker.changed([down, impostor], none());
        assert_eq!(seen.len(), 1);
        assert_eq!(
            (seen[0].addr, seen[0].update.state),
            (addr(1), SwimState::Dead)
        );
    }
}
