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
    //! The tracker on what foca applied, call by call. Over foca members
    //! exchanging datagrams, it is tested on the one simulator
    //! (`tests/gate/simulation.rs`, `tracker`), its facts checked against the
    //! orchestrator's member's whole view at every instant.

    use std::net::SocketAddr;

    use super::*;
    use crate::live::nodes::Nodes;

    fn addr(i: usize) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], 7000 + i as u16))
    }

    fn member(node: &str, generation: u64, state: State) -> Member<SwimIdentity> {
        let id = SwimIdentity::new(node, addr(1), generation);
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
            SwimIdentity::new(
                impostor.id().node.clone(),
                addr(2),
                impostor.id().generation,
            ),
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
