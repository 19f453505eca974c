//! A membership source without incarnations, made safe to feed the gate.
//!
//! The gate admits membership facts by SWIM's precedence (design §1,
//! [`Membership::admits`](crate::Membership::admits)): a suspicion is
//! refuted only by `alive` at a *higher* incarnation, so a source that
//! says `alive` at the same incarnation after `suspect` is silently
//! stale, and the node stays suspect for good. SWIM (foca, memberlist)
//! keeps incarnations itself; a heartbeat table, a cloud API or a
//! container scheduler does not. [`PlainMembership`] gives each change such
//! a source reports the incarnation the gate needs.

use std::collections::BTreeMap;

use crate::ids::NodeId;
use crate::input::MembershipUpdate;
use crate::node::SwimState;

/// The incarnations of a membership source that has none: one per gate,
/// fed every membership fact of that source, in order, and kept for the
/// gate's life (the gate remembers the incarnations it admitted: a fresh
/// counter would start below them).
///
/// ```
/// use poolgate_core::{NodeId, PlainMembership, SwimState};
///
/// let node = NodeId::new("node-1").unwrap();
/// let mut source = PlainMembership::default();
/// let alive = source.update(node.clone(), SwimState::Alive).unwrap();
/// let suspect = source.update(node.clone(), SwimState::Suspect).unwrap();
/// // Back to alive: at a higher incarnation, so the gate takes it.
/// let again = source.update(node.clone(), SwimState::Alive).unwrap();
/// assert!(again.incarnation > suspect.incarnation);
/// // Saying the same again is no news.
/// assert_eq!(source.update(node, SwimState::Alive), None);
/// # let _ = alive;
/// ```
#[derive(Debug, Default, Clone)]
pub struct PlainMembership {
    said: BTreeMap<NodeId, (SwimState, u64)>,
}

impl PlainMembership {
    /// The update that tells the gate `node` is now `state`, with an
    /// incarnation it admits; `None` when there is nothing to tell: the
    /// state it last said, or a suspicion of a node never seen alive or
    /// said down (the gate would ignore it: the node is not ready either
    /// way). The state counts as said once this returns: an update the
    /// gate did not take (it had stopped) is not handed out again.
    pub fn update(&mut self, node: NodeId, state: SwimState) -> Option<MembershipUpdate> {
        let incarnation = match self.said.get(&node).copied() {
            None => match state {
                SwimState::Suspect => return None,
                _ => 1,
            },
            Some((said, _)) if said == state => return None,
            Some((said, i)) => match state {
                // Refutes a suspicion, or comes back from down.
                SwimState::Alive => i.checked_add(1)?,
                SwimState::Suspect if said.is_down() => return None,
                SwimState::Suspect => i,
                // Dead after left (or left after dead) needs a newer one.
                SwimState::Dead | SwimState::Left if said.is_down() => i.checked_add(1)?,
                SwimState::Dead | SwimState::Left => i,
            },
        };
        self.said.insert(node.clone(), (state, incarnation));
        Some(MembershipUpdate {
            node,
            state,
            incarnation,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::Membership;

    const STATES: [SwimState; 4] = [
        SwimState::Alive,
        SwimState::Suspect,
        SwimState::Dead,
        SwimState::Left,
    ];

    /// What the gate's view should say after the source said `states`,
    /// from the precedence rules' intent alone: the latest state said,
    /// except that a suspicion of a node not alive at that moment is no
    /// news (nothing to suspect).
    fn expected(states: &[SwimState]) -> Option<SwimState> {
        let mut view = None;
        for &state in states {
            view = match (view, state) {
                (None, SwimState::Suspect) => None,
                (Some(s), SwimState::Suspect)
                    if s != SwimState::Alive && s != SwimState::Suspect =>
                {
                    Some(s)
                }
                _ => Some(state),
            };
        }
        view
    }

    #[test]
    fn every_sequence_of_up_to_five_states_reaches_the_gate_as_said() {
        // All 4 + 16 + … + 1024 sequences: each update the source makes
        // is admitted by the gate's precedence, and the view ends as the
        // source said.
        let mut sequences: Vec<Vec<SwimState>> = vec![vec![]];
        for _ in 0..5 {
            sequences = sequences
                .into_iter()
                .flat_map(|s| {
                    STATES.iter().map(move |&state| {
                        let mut next = s.clone();
                        next.push(state);
                        next
                    })
                })
                .collect();
            for states in &sequences {
                let node = NodeId::new("n").unwrap();
                let mut source = PlainMembership::default();
                let mut view = Membership::NeverSeen;
                for &state in states {
                    if let Some(update) = source.update(node.clone(), state) {
                        assert!(
                            view.admits(update.state, update.incarnation),
                            "{states:?}: {update:?} refused over {view:?}"
                        );
                        view = Membership::Seen {
                            state: update.state,
                            incarnation: update.incarnation,
                        };
                    }
                }
                assert_eq!(view.state(), expected(states), "{states:?}");
            }
        }
    }

    #[test]
    fn alive_again_after_suspect_is_a_higher_incarnation_and_repeats_are_silent() {
        let node = NodeId::new("n").unwrap();
        let mut source = PlainMembership::default();
        assert_eq!(source.update(node.clone(), SwimState::Suspect), None);
        let first = source.update(node.clone(), SwimState::Alive).unwrap();
        assert_eq!(source.update(node.clone(), SwimState::Alive), None);
        let suspect = source.update(node.clone(), SwimState::Suspect).unwrap();
        assert_eq!(suspect.incarnation, first.incarnation);
        let again = source.update(node, SwimState::Alive).unwrap();
        assert!(again.incarnation > suspect.incarnation);
    }
}
