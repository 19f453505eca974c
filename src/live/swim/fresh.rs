//! A term starts from a fresh view: what a replica's warm SWIM member
//! believed of a node before the term began is no ground for a fault in
//! it (a leader isolated, deposed and healed holds members down that
//! never died).
//!
//! At attachment, the member's whole view is split: alive members are
//! told at once; a member suspect or down is held back, by name and
//! address, at the generation it had. Later facts about a held member
//! are dropped while they only repeat the old doubt (suspect or down, at
//! that generation or older); the first fact that it is alive, or of a
//! newer generation, lets it go and is told. A held member that never
//! comes back is therefore never seen by the term: a committed run that
//! needs it faults `unconfirmed` when its restore grace ends, the rule
//! of a gate that starts from nothing.

use std::collections::HashMap;
use std::net::SocketAddr;

use poolgate_actors::core::SwimState;

use super::tracker::SwimFact;

/// The members held back from the current term, and what they were.
#[derive(Debug, Default)]
pub struct BeforeTerm {
    /// (name, address) → the generation it was in doubt at.
    held: HashMap<(String, SocketAddr), u64>,
}

/// A folded incarnation's generation (its high bits).
fn generation(incarnation: u64) -> u64 {
    incarnation >> 16
}

impl BeforeTerm {
    /// A new term over the member's `view` (one fact per member): the
    /// facts to tell it now, and what is held back.
    pub fn attach(view: Vec<SwimFact>) -> (BeforeTerm, Vec<SwimFact>) {
        let mut held = HashMap::new();
        let mut told = Vec::with_capacity(view.len());
        for fact in view {
            if fact.update.state == SwimState::Alive {
                told.push(fact);
            } else {
                held.insert(
                    (fact.update.node.as_str().to_string(), fact.addr),
                    generation(fact.update.incarnation),
                );
            }
        }
        (BeforeTerm { held }, told)
    }

    /// Whether `fact` is told to the term (false: it repeats a doubt
    /// held before the term).
    pub fn admits(&mut self, fact: &SwimFact) -> bool {
        if self.held.is_empty() {
            return true;
        }
        let key = (fact.update.node.as_str().to_string(), fact.addr);
        let Some(&held_at) = self.held.get(&key) else {
            return true;
        };
        let doubt = fact.update.state != SwimState::Alive;
        if doubt && generation(fact.update.incarnation) <= held_at {
            return false;
        }
        self.held.remove(&key);
        true
    }

    /// How many members are held back.
    pub fn held(&self) -> usize {
        self.held.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use poolgate_actors::core::{MembershipUpdate, NodeId};

    fn fact(node: &str, port: u16, state: SwimState, generation: u64, inc: u64) -> SwimFact {
        SwimFact {
            update: MembershipUpdate {
                node: NodeId::new(node).unwrap(),
                state,
                incarnation: (generation << 16) | inc,
            },
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            replaced: false,
        }
    }

    #[test]
    fn a_doubt_held_before_the_term_is_not_told_until_the_member_is_alive_again() {
        let (mut term, told) = BeforeTerm::attach(vec![
            fact("a", 1, SwimState::Alive, 5, 0),
            fact("b", 2, SwimState::Dead, 5, 1),
            fact("c", 3, SwimState::Suspect, 7, 2),
        ]);
        assert_eq!(told, vec![fact("a", 1, SwimState::Alive, 5, 0)]);
        assert_eq!(term.held(), 2);
        // The periodic whole-view check repeats b's death: dropped.
        assert!(!term.admits(&fact("b", 2, SwimState::Dead, 5, 1)));
        // c's suspicion, held before the term, ends in death: dropped.
        assert!(!term.admits(&fact("c", 3, SwimState::Dead, 7, 2)));
        // Another member of the same name elsewhere is not held.
        assert!(term.admits(&fact("b", 9, SwimState::Dead, 5, 1)));
        // b rejoins under a new generation: told, and no longer held.
        assert!(term.admits(&fact("b", 2, SwimState::Alive, 6, 0)));
        assert!(term.admits(&fact("b", 2, SwimState::Dead, 6, 0)));
        // c refutes its suspicion: told; its next doubt is the term's own.
        assert!(term.admits(&fact("c", 3, SwimState::Alive, 7, 3)));
        assert!(term.admits(&fact("c", 3, SwimState::Suspect, 7, 3)));
        assert_eq!(term.held(), 0);
        // What the term saw alive is told whatever comes next.
        assert!(term.admits(&fact("a", 1, SwimState::Dead, 5, 0)));
    }

    #[test]
    fn a_doubt_of_a_newer_generation_is_the_terms_own() {
        let (mut term, _) = BeforeTerm::attach(vec![fact("b", 2, SwimState::Dead, 5, 1)]);
        assert!(term.admits(&fact("b", 2, SwimState::Suspect, 6, 0)));
    }
}
