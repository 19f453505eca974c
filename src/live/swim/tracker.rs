//! foca's membership view → the gate's SWIM observations.
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
//! node's own word (it announces that it is leaving). A member that
//! vanishes from foca's view (removed after down, or replaced at its
//! address) is reported `dead` at the incarnation last reported, so it
//! cannot stay "alive" in the gate.

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
pub struct Observed {
    /// The membership fact.
    pub update: MembershipUpdate,
    /// Where the member that says so answers.
    pub addr: SocketAddr,
}

/// The latest state reported per member (node name and address), to emit
/// only changes.
#[derive(Debug, Default)]
pub struct MembershipTracker {
    reported: HashMap<(String, SocketAddr), (SwimState, u64)>,
}

impl MembershipTracker {
    /// Compares foca's full membership (`Foca::iter_membership_state`) with
    /// what was reported before; returns one update per member that
    /// changed. Members are told apart by name and address: another member
    /// calling itself N from elsewhere is reported separately, never in N's
    /// place. At one address the highest generation speaks (a restart).
    pub fn diff<'a>(
        &mut self,
        members: impl Iterator<Item = &'a Member<SwimIdentity>>,
    ) -> Vec<Observed> {
        let mut newest: HashMap<(&str, SocketAddr), &Member<SwimIdentity>> = HashMap::new();
        for member in members {
            let id = member.id();
            if id.generation >= GENERATION_LIMIT {
                tracing::warn!(member = %id.node, "a SWIM member's generation is 2^48 or more; ignored");
                continue;
            }
            match newest.get(&(id.node.as_str(), id.addr)) {
                Some(known) if known.id().generation >= id.generation => {}
                _ => {
                    newest.insert((id.node.as_str(), id.addr), member);
                }
            }
        }
        let mut updates = Vec::new();
        let mut present = HashSet::with_capacity(newest.len());
        for ((node, addr), member) in newest {
            present.insert((node, addr));
            let state = match member.state() {
                State::Alive => SwimState::Alive,
                State::Suspect => SwimState::Suspect,
                State::Down => SwimState::Dead,
            };
            let incarnation = (member.id().generation << 16) | u64::from(member.incarnation());
            self.report(node, addr, state, incarnation, &mut updates);
        }
        // Members foca no longer lists: dead, unless already reported so.
        let vanished: Vec<(String, SocketAddr, u64)> = self
            .reported
            .iter()
            .filter(|((node, addr), (state, _))| {
                *state != SwimState::Dead && !present.contains(&(node.as_str(), *addr))
            })
            .map(|((node, addr), (_, incarnation))| (node.clone(), *addr, *incarnation))
            .collect();
        for (node, addr, incarnation) in vanished {
            self.report(&node, addr, SwimState::Dead, incarnation, &mut updates);
        }
        updates.sort_by(|a, b| (&a.update.node, a.addr).cmp(&(&b.update.node, b.addr)));
        updates
    }

    fn report(
        &mut self,
        node: &str,
        addr: SocketAddr,
        state: SwimState,
        incarnation: u64,
        updates: &mut Vec<Observed>,
    ) {
        let key = (node.to_string(), addr);
        if self.reported.get(&key) == Some(&(state, incarnation)) {
            return;
        }
        self.reported.insert(key, (state, incarnation));
        let Ok(node_id) = NodeId::new(node) else {
            // Noted once per change of the member; never reported.
            tracing::warn!(
                member = node,
                "a SWIM member's name is not a valid node id; ignored"
            );
            return;
        };
        updates.push(Observed {
            update: MembershipUpdate {
                node: node_id,
                state,
                incarnation,
            },
            addr,
        });
    }
}

#[cfg(test)]
mod tests {
    //! foca instances wired together in memory, on a virtual millisecond
    //! clock: deterministic, no sockets.

    use std::cmp::Reverse;
    use std::collections::{BinaryHeap, VecDeque};
    use std::net::SocketAddr;

    use foca::{AccumulatingRuntime, Foca, NoCustomBroadcast, PostcardCodec, Timer};
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    use super::*;
    use crate::live::swim::SwimSettings;

    type SimFoca = Foca<SwimIdentity, PostcardCodec, StdRng, NoCustomBroadcast>;

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
        seen: Vec<MembershipUpdate>,
    }

    fn addr(i: usize) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], 7000 + i as u16))
    }

    fn new_foca(i: usize, generation: u64) -> SimFoca {
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
            PostcardCodec,
        )
    }

    impl Sim {
        /// `n` members, each announcing itself to member 0.
        fn new(n: usize) -> Self {
            let mut sim = Sim {
                now: 0,
                seq: 0,
                nodes: (0..n)
                    .map(|i| SimNode {
                        foca: new_foca(i, 0),
                        runtime: AccumulatingRuntime::new(),
                        up: true,
                    })
                    .collect(),
                timers: BinaryHeap::new(),
                wire: VecDeque::new(),
                tracker: MembershipTracker::default(),
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
            let node = &mut self.nodes[i];
            while let Some((to, data)) = node.runtime.to_send() {
                let index = (to.addr.port() - 7000) as usize;
                self.wire.push_back((index, data.to_vec()));
            }
            while let Some((after, timer)) = node.runtime.to_schedule() {
                self.seq += 1;
                let at = self.now + after.as_millis() as u64;
                self.timers.push(Reverse((at, self.seq, i, timer)));
            }
            while node.runtime.to_notify().is_some() {}
            while let Some((to, data)) = self.wire.pop_front() {
                if self.nodes[to].up && self.nodes[i].up {
                    let target = &mut self.nodes[to];
                    let _ = target.foca.handle_data(&data, &mut target.runtime);
                    self.settle(to);
                }
            }
            let updates = self
                .tracker
                .diff(self.nodes[0].foca.iter_membership_state());
            self.seen.extend(updates.into_iter().map(|o| o.update));
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
            foca: new_foca(2, 1),
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

    #[test]
    fn a_member_that_vanishes_from_the_view_is_reported_dead() {
        let mut tracker = MembershipTracker::default();
        let alive = [member("n1", 5, State::Alive)];
        assert_eq!(tracker.diff(alive.iter()).len(), 1);
        let gone = tracker.diff(std::iter::empty());
        assert_eq!(gone.len(), 1);
        assert_eq!(gone[0].update.state, SwimState::Dead);
        assert_eq!(gone[0].update.incarnation, 5 << 16);
        assert!(tracker.diff(std::iter::empty()).is_empty(), "reported once");
    }

    #[test]
    fn a_generation_that_would_lose_bits_is_ignored() {
        let mut tracker = MembershipTracker::default();
        let members = [member("n1", GENERATION_LIMIT, State::Alive)];
        assert!(tracker.diff(members.iter()).is_empty());
        let members = [member("n1", GENERATION_LIMIT - 1, State::Alive)];
        let update = tracker.diff(members.iter());
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
        let seen = tracker.diff(both.iter());
        assert_eq!(seen.len(), 2);
        // The real member goes down: that is reported, whatever the other says.
        let down = Member::new(real.id().clone(), 0, State::Down);
        let seen = tracker.diff([down, impostor].iter());
        assert_eq!(seen.len(), 1);
        assert_eq!(
            (seen[0].addr, seen[0].update.state),
            (addr(1), SwimState::Dead)
        );
    }
}
