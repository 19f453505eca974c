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
//! reported `dead` and marked replaced, so it cannot stay "alive" in the
//! gate.
//!
//! The tracker holds no member state: foca holds the view, and the one
//! table between foca and the gate is the orchestrator's
//! ([`crate::live::nodes::Nodes`]), which keeps the latest fact per
//! identity and passes on only what changed. The tracker is fed what foca
//! applied during one call (see [`super::watch`]) and gives one fact per
//! member it touched, so its cost is in proportion to the change, not to
//! the cluster: it never walks foca's whole membership.

use std::collections::HashSet;
use std::net::SocketAddr;

use foca::{Member, State};
use poolgate_actors::core::{MembershipUpdate, NodeId, SwimState};

use super::identity::SwimIdentity;

/// Generations must stay below this to fold into an incarnation.
pub const GENERATION_LIMIT: u64 = 1 << 48;

/// One fact about a member as seen from here: the update for the gate, and
/// the SWIM address of the member it is about (facts about node N count
/// only from the address N signed; the orchestrator checks that).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SwimFact {
    /// The membership fact.
    pub update: MembershipUpdate,
    /// Where the member that says so answers.
    pub addr: SocketAddr,
    /// The member is reported dead because another identity took its
    /// address (foca's `Rename`), not because SWIM found it gone. Its
    /// incarnation is the lowest of its generation, or the one foca
    /// applied in the same call: the table that holds what was told of
    /// the identity raises it to that ([`crate::live::nodes::Nodes`]).
    pub replaced: bool,
}

/// Turns what foca applied into facts about the members wanted. With
/// [`MembershipTracker::only`], members of other names are dropped here:
/// invented members cost nothing further on.
#[derive(Debug, Default)]
pub struct MembershipTracker {
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
    /// Reports only members named in `names` (the orchestrator's
    /// registry: a fact about any other name could never count).
    pub fn only(&mut self, names: HashSet<String>) {
        self.only = Some(names);
    }

    fn wanted(&self, node: &str) -> bool {
        self.only.as_ref().is_none_or(|names| names.contains(node))
    }

    /// Turns what one foca call applied into one fact per member it
    /// touched: `states` are member states as foca applied them, oldest
    /// first (a member may appear more than once; its last state counts);
    /// `replaced` are the identities foca dropped for a newer one at their
    /// address (its `Rename(old, new)` notifications). Members are told
    /// apart by name and address: another member calling itself N from
    /// elsewhere is reported separately, never in N's place. A state that
    /// repeats what was reported before is reported again: what changed is
    /// decided by the one table that holds the facts. Facts come sorted by
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
            if !self.wanted(key.0) || old.generation >= GENERATION_LIMIT || !done.insert(key) {
                continue;
            }
            // Gone: dead at the incarnation foca applied in this call, or
            // at its generation's lowest (raised to what was told of it by
            // the table that holds that).
            let incarnation = states
                .iter()
                .rev()
                .find(|m| m.id() == old)
                .map_or(old.generation << 16, |m| fold(m).1);
            report(
                key.0,
                key.1,
                (SwimState::Dead, incarnation),
                true,
                &mut updates,
            );
        }
        for member in states.iter().rev() {
            let id = member.id();
            if !self.wanted(&id.node) || !done.insert((id.node.as_str(), id.addr)) {
                continue; // not wanted, or a later state of it was taken
            }
            if id.generation >= GENERATION_LIMIT {
                tracing::debug!(member = %id.node, "a SWIM member's generation is 2^48 or more; ignored");
                continue;
            }
            report(&id.node, id.addr, fold(member), false, &mut updates);
        }
        updates.sort_by(|a, b| (&a.update.node, a.addr).cmp(&(&b.update.node, b.addr)));
        updates
    }
}

fn report(
    node: &str,
    addr: SocketAddr,
    (state, incarnation): (SwimState, u64),
    replaced: bool,
    updates: &mut Vec<SwimFact>,
) {
    let Ok(node_id) = NodeId::new(node) else {
        tracing::debug!(
            member = node,
            "a SWIM member's name is not a valid node id; ignored"
        );
        return;
    };
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
    use std::collections::{BinaryHeap, HashMap, VecDeque};
    use std::net::SocketAddr;

    use foca::{AccumulatingRuntime, Foca, NoCustomBroadcast, Timer};
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    use super::*;
    use crate::live::nodes::Nodes;
    use crate::live::swim::drive;
    use crate::live::swim::watch::{Changes, WatchingCodec};
    use crate::live::swim::SwimTimings;

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
        /// The one table of SWIM facts the tracker feeds.
        table: Nodes,
        /// The facts new to the table, in order.
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
        let config = SwimTimings::FAST.foca_config(4);
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
                table: Nodes::default(),
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
                let facts = drive::track(&mut self.tracker, &self.changes, &own, replaced);
                for fact in facts {
                    let update = fact.update.clone();
                    if self.table.observe(fact).is_new() {
                        self.seen.push(update);
                    }
                }
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

        /// The table the tracker feeds, fed only what foca applied, agrees
        /// with member 0's whole view: every identity foca lists is held
        /// in its state, and one foca no longer lists was last held dead.
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
                view.insert(
                    (id.node.clone(), id.addr, id.generation),
                    (state, incarnation),
                );
            }
            for (addr, latest) in self.table.held() {
                let node = &latest.node;
                let key = (node.to_string(), addr, latest.incarnation >> 16);
                let now = (latest.state, latest.incarnation);
                match view.remove(&key) {
                    Some(listed) => assert_eq!(listed, now, "{node}@{addr}"),
                    None => assert_eq!(now.0, SwimState::Dead, "{node}@{addr} vanished"),
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

    /// The facts that are new to `table`.
    fn new_to(table: &mut Nodes, facts: Vec<SwimFact>) -> Vec<SwimFact> {
        facts
            .into_iter()
            .filter(|fact| table.observe(fact.clone()).is_new())
            .collect()
    }

    #[test]
    fn a_member_replaced_at_its_address_by_another_name_is_reported_dead() {
        let (mut tracker, mut table) = (MembershipTracker::default(), Nodes::default());
        let alive = member("n1", 5, State::Alive);
        assert_eq!(
            new_to(&mut table, tracker.changed([alive.clone()], none())).len(),
            1
        );
        let other = member("n9", 6, State::Alive);
        let renamed = (alive.id().clone(), other.id().clone());
        let seen = new_to(&mut table, tracker.changed([other], [renamed.clone()]));
        assert_eq!(seen.len(), 2, "{seen:?}");
        assert_eq!(seen[0].update.node.as_str(), "n1");
        assert_eq!(seen[0].update.state, SwimState::Dead);
        assert_eq!(seen[0].update.incarnation, 5 << 16);
        assert!(seen[0].replaced, "dead by replacement, so marked");
        assert_eq!(seen[1].update.node.as_str(), "n9");
        assert!(!seen[1].replaced);
        let again = tracker.changed([], [renamed]);
        assert!(new_to(&mut table, again).is_empty(), "new once");
        // A replaced identity never heard of has nothing to lose.
        let never = (
            member("n7", 3, State::Alive).id().clone(),
            member("n8", 4, State::Alive).id().clone(),
        );
        assert!(new_to(&mut table, tracker.changed([], [never])).is_empty());
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
        let seen = tracker.changed([member("n1", 1, State::Alive)], none());
        assert_eq!(seen.len(), 1);
    }

    #[test]
    fn many_names_at_one_address_are_told_apart_and_repeats_go_no_further_than_the_table() {
        let (mut tracker, mut table) = (MembershipTracker::default(), Nodes::default());
        let names: Vec<_> = (0..20_000)
            .map(|i| member(&format!("n{i}"), 1, State::Alive))
            .collect();
        let first = tracker.changed(names.clone(), none());
        assert_eq!(new_to(&mut table, first).len(), 20_000);
        // Each found by its name (a hash lookup since issue 20, not a scan).
        let again = tracker.changed(names, none());
        assert_eq!(again.len(), 20_000);
        assert!(new_to(&mut table, again).is_empty());
    }

    #[test]
    fn a_member_noted_twice_in_one_call_is_reported_in_its_last_state() {
        let (mut tracker, mut table) = (MembershipTracker::default(), Nodes::default());
        let seen = tracker.changed(
            [
                member("n1", 1, State::Alive),
                member("n1", 1, State::Suspect),
            ],
            none(),
        );
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].update.state, SwimState::Suspect);
        assert_eq!(new_to(&mut table, seen).len(), 1);
        let again = tracker.changed([member("n1", 1, State::Suspect)], none());
        assert!(
            new_to(&mut table, again).is_empty(),
            "a repeated state is no change"
        );
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
        let (mut tracker, mut table) = (MembershipTracker::default(), Nodes::default());
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
        let seen = new_to(&mut table, tracker.changed(both, none()));
        assert_eq!(seen.len(), 2);
        // The real member goes down: that is reported, whatever the other says.
        let down = Member::new(real.id().clone(), 0, State::Down);
        let seen = new_to(&mut table, tracker.changed([down, impostor], none()));
        assert_eq!(seen.len(), 1);
        assert_eq!(
            (seen[0].addr, seen[0].update.state),
            (addr(1), SwimState::Dead)
        );
    }
}
