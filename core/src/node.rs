//! One candidate's facts, how an observation changes them, and the verdict
//! "ready" or "blocked by …" over them (design §1).
//!
//! [`NodeFacts::apply`] is the only way facts change. It answers
//! [`Applied::Changed`] only when the view really changed: a duplicate is not
//! a change, and a stale SWIM observation (older incarnation, see
//! [`Membership::admits`]) is ignored so a delayed message cannot roll the
//! view back.

use std::fmt;

use serde::Serialize;

use crate::identity::Fingerprint;

/// A SWIM member state as the membership feed reports it.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SwimState {
    /// Answering probes. Entered by joining or by refuting a suspicion with a
    /// higher incarnation.
    Alive,
    /// Missed probes; not yet declared dead. Left by a refutation (alive at a
    /// higher incarnation) or by confirmation (dead).
    Suspect,
    /// Declared down by the protocol. Left only by a rejoin at a higher
    /// incarnation.
    Dead,
    /// Left the cluster gracefully. Left only by a rejoin at a higher
    /// incarnation.
    Left,
}

impl SwimState {
    /// The state's name as the replay format spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            SwimState::Alive => "alive",
            SwimState::Suspect => "suspect",
            SwimState::Dead => "dead",
            SwimState::Left => "left",
        }
    }

    /// Dead or left.
    pub fn is_down(self) -> bool {
        matches!(self, SwimState::Dead | SwimState::Left)
    }
}

impl fmt::Display for SwimState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the SWIM view says of a node.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub enum Membership {
    /// No SWIM observation yet. Left by the first admitted observation.
    #[default]
    NeverSeen,
    /// The latest admitted state and its incarnation.
    Seen {
        /// The state.
        state: SwimState,
        /// The incarnation it was reported at.
        incarnation: u64,
    },
}

impl Membership {
    /// SWIM precedence (design §1, as in memberlist and foca): whether an
    /// observation of `state` at `incarnation` may replace this one.
    ///
    /// - alive at j: j > i, or nothing seen yet;
    /// - suspect at j: j ≥ i and alive, or suspect and j > i;
    /// - dead / left at j: j ≥ i, unless already dead/left at ≥ j.
    pub fn admits(self, state: SwimState, incarnation: u64) -> bool {
        let Membership::Seen {
            state: current,
            incarnation: i,
        } = self
        else {
            // Nothing seen: alive and down are news; a suspicion of a member
            // never seen alive has nothing to suspect.
            return state != SwimState::Suspect;
        };
        let j = incarnation;
        match state {
            SwimState::Alive => j > i,
            SwimState::Suspect => match current {
                SwimState::Alive => j >= i,
                SwimState::Suspect => j > i,
                SwimState::Dead | SwimState::Left => false,
            },
            SwimState::Dead | SwimState::Left => j >= i && !(current.is_down() && i >= j),
        }
    }

    /// The state, if any was seen.
    pub fn state(self) -> Option<SwimState> {
        match self {
            Membership::NeverSeen => None,
            Membership::Seen { state, .. } => Some(state),
        }
    }
}

/// One observation about one node, from any of the three inputs.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Observation {
    /// Registry: the orchestrator knows the node.
    Known,
    /// Registry: the orchestrator forgot the node; clears known and identity.
    Forgotten,
    /// SWIM: the member's state at an incarnation.
    Swim {
        /// The reported state.
        state: SwimState,
        /// The incarnation it was reported at.
        incarnation: u64,
    },
    /// Node agent: `NodeAvailable`.
    Available,
    /// Node agent: the node withdrew its availability.
    Unavailable,
    /// Node agent: data-plane identity material (new or rotated).
    /// (Only its fingerprint travels: the material itself stays with the
    /// caller, and a recording holds the fingerprint alone.)
    Identity(Fingerprint),
    /// Node agent: the node is faulted; clears available.
    Faulted {
        /// Why, in the agent's words (made safe to show).
        reason: FaultReason,
    },
    /// Node agent: the fault is cleared.
    Recovered,
}

/// Longest fault reason kept, in bytes.
pub const MAX_REASON_BYTES: usize = 1024;

/// A node's own words for its fault, made safe to keep and show.
///
/// A fault is never lost to its wording (design §5): any text is accepted;
/// each control character becomes U+FFFD and the result is cut to
/// [`MAX_REASON_BYTES`] on a character boundary.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct FaultReason(String);

impl FaultReason {
    /// The reason `text`, control characters replaced and cut to length.
    pub fn new(text: &str) -> Self {
        let mut reason = String::with_capacity(text.len().min(MAX_REASON_BYTES));
        for c in text.chars() {
            let c = if c.is_control() {
                char::REPLACEMENT_CHARACTER
            } else {
                c
            };
            if reason.len() + c.len_utf8() > MAX_REASON_BYTES {
                break;
            }
            reason.push(c);
        }
        FaultReason(reason)
    }

    /// The reason as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The reason as an owned string.
    pub fn into_string(self) -> String {
        self.0
    }
}

impl fmt::Display for FaultReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Why a view changed, as `readiness_lost` and `run_faulted` report it.
#[derive(
    Clone, Copy, PartialEq, Eq, Hash, Debug, Serialize, serde::Deserialize, PartialOrd, Ord,
)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Reason {
    /// The orchestrator forgot the node.
    Unknown,
    /// SWIM suspects the node.
    Suspect,
    /// SWIM declared the node dead.
    Dead,
    /// The node left the SWIM cluster.
    Left,
    /// The node withdrew `NodeAvailable`.
    Unavailable,
    /// The node has no identity material.
    NoIdentity,
    /// The node's identity material changed.
    IdentityChanged,
    /// The node reported a fault.
    Faulted,
    /// Any other change to the view (an incarnation bump, a recovery, …).
    ViewChanged,
    /// The orchestrator replaced the candidate pool.
    PoolRedefined,
    /// The gate's own actor for the node failed and was replaced with no
    /// facts: not the node's fault.
    Internal,
    /// After a restart of the gate, a restored run's required node was not
    /// seen ready with its committed fingerprint within the grace period.
    Unconfirmed,
}

impl Reason {
    /// The reason as the replay format spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Unknown => "unknown",
            Reason::Suspect => "suspect",
            Reason::Dead => "dead",
            Reason::Left => "left",
            Reason::Unavailable => "unavailable",
            Reason::NoIdentity => "no_identity",
            Reason::IdentityChanged => "identity_changed",
            Reason::Faulted => "faulted",
            Reason::ViewChanged => "view_changed",
            Reason::PoolRedefined => "pool_redefined",
            Reason::Internal => "internal",
            Reason::Unconfirmed => "unconfirmed",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One condition that keeps a node from being ready.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Serialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Blocker {
    /// The orchestrator does not know the node.
    Unknown,
    /// SWIM has never seen the node, or sees it dead or left.
    NotLive,
    /// SWIM suspects the node.
    Suspect,
    /// The node has not said `NodeAvailable` (or withdrew it).
    NotAvailable,
    /// The node has no identity material.
    NoIdentity,
    /// The node reported a fault that is not cleared.
    Faulted,
}

impl Blocker {
    /// Every blocker, in the order reports list them.
    pub const ALL: [Blocker; 6] = [
        Blocker::Unknown,
        Blocker::NotLive,
        Blocker::Suspect,
        Blocker::NotAvailable,
        Blocker::NoIdentity,
        Blocker::Faulted,
    ];

    /// The blocker as reports spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Blocker::Unknown => "unknown",
            Blocker::NotLive => "not_live",
            Blocker::Suspect => "suspect",
            Blocker::NotAvailable => "not_available",
            Blocker::NoIdentity => "no_identity",
            Blocker::Faulted => "faulted",
        }
    }

    const fn bit(self) -> u8 {
        1 << self as u8
    }
}

/// The verdict over one node's facts: ready when no blocker is set.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Verdict(u8);

impl Verdict {
    /// A node with no facts at all: blocked by everything but suspicion and
    /// faults.
    pub const NOTHING_KNOWN: Verdict = Verdict(
        Blocker::Unknown.bit()
            | Blocker::NotLive.bit()
            | Blocker::NotAvailable.bit()
            | Blocker::NoIdentity.bit(),
    );

    /// Ready: known ∧ alive ∧ available ∧ identity ∧ ¬faulted.
    pub fn is_ready(self) -> bool {
        self.0 == 0
    }

    /// Whether `blocker` holds.
    pub fn has(self, blocker: Blocker) -> bool {
        self.0 & blocker.bit() != 0
    }

    /// The blockers that hold, in report order.
    pub fn blockers(self) -> impl Iterator<Item = Blocker> {
        Blocker::ALL.into_iter().filter(move |b| self.has(*b))
    }

    fn with(self, blocker: Blocker, holds: bool) -> Self {
        if holds {
            Verdict(self.0 | blocker.bit())
        } else {
            Verdict(self.0 & !blocker.bit())
        }
    }
}

impl fmt::Debug for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_ready() {
            return f.write_str("Ready");
        }
        f.debug_list()
            .entries(self.blockers().map(Blocker::as_str))
            .finish()
    }
}

/// What an applied observation did.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Applied {
    /// The view changed.
    Changed(NodeChange),
    /// The observation repeated what the view already said.
    Duplicate,
    /// A SWIM observation older than the view (design §1 precedence); ignored.
    Stale,
}

/// A real change of one node's view: what the pool and a run need to know.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct NodeChange {
    /// Why the view changed.
    pub reason: Reason,
    /// The verdict before the change.
    pub before: Verdict,
    /// The verdict after the change.
    pub after: Verdict,
    /// The identity fingerprint after the change.
    pub fingerprint: Option<Fingerprint>,
}

impl NodeChange {
    /// Whether this change, of a node that a committed run requires (ready
    /// when the plan was committed, and ever since as far as the run was
    /// told), takes it out of the run (design §3): it is not ready, or it
    /// kept being ready under another identity. Not ready before as well is
    /// a loss too: a change the run was not told of came in between (the
    /// pool's actor failed while handling it, and its restart reported the
    /// node afresh).
    pub fn loses_required_node(&self) -> bool {
        !self.after.is_ready() || self.reason == Reason::IdentityChanged
    }
}

/// Everything the gate holds about one candidate (design §1).
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct NodeFacts {
    known: bool,
    membership: Membership,
    available: bool,
    identity: Option<Fingerprint>,
    fault: Option<String>,
}

impl NodeFacts {
    /// Applies one observation; see the module doc for what counts as a
    /// change.
    pub fn apply(&mut self, observation: Observation) -> Applied {
        self.observe(&observation)
    }

    /// As [`NodeFacts::apply`], by reference: the caller keeps the
    /// observation (the node actor passes it on only when it changed the
    /// view), and nothing is copied for a duplicate.
    pub fn observe(&mut self, observation: &Observation) -> Applied {
        let before = self.verdict();
        let reason = match *observation {
            Observation::Known => {
                if self.known {
                    return Applied::Duplicate;
                }
                self.known = true;
                Reason::ViewChanged
            }
            Observation::Forgotten => {
                if !self.known && self.identity.is_none() {
                    return Applied::Duplicate;
                }
                self.known = false;
                self.identity = None;
                Reason::Unknown
            }
            Observation::Swim { state, incarnation } => {
                let next = Membership::Seen { state, incarnation };
                if self.membership == next {
                    return Applied::Duplicate;
                }
                if !self.membership.admits(state, incarnation) {
                    return Applied::Stale;
                }
                self.membership = next;
                match state {
                    SwimState::Alive => Reason::ViewChanged,
                    SwimState::Suspect => Reason::Suspect,
                    SwimState::Dead => Reason::Dead,
                    SwimState::Left => Reason::Left,
                }
            }
            Observation::Available => {
                if self.available {
                    return Applied::Duplicate;
                }
                self.available = true;
                Reason::ViewChanged
            }
            Observation::Unavailable => {
                if !self.available {
                    return Applied::Duplicate;
                }
                self.available = false;
                Reason::Unavailable
            }
            Observation::Identity(fingerprint) => match self.identity.replace(fingerprint) {
                Some(previous) if previous == fingerprint => return Applied::Duplicate,
                Some(_) => Reason::IdentityChanged,
                None => Reason::ViewChanged,
            },
            Observation::Faulted { ref reason } => {
                if self.fault.as_deref() == Some(reason.as_str()) && !self.available {
                    return Applied::Duplicate;
                }
                self.fault = Some(reason.as_str().to_string());
                self.available = false;
                Reason::Faulted
            }
            Observation::Recovered => {
                if self.fault.take().is_none() {
                    return Applied::Duplicate;
                }
                Reason::ViewChanged
            }
        };
        Applied::Changed(NodeChange {
            reason,
            before,
            after: self.verdict(),
            fingerprint: self.identity,
        })
    }

    /// The one readiness verdict over these facts; reports use it too.
    pub fn verdict(&self) -> Verdict {
        let state = self.membership.state();
        Verdict::default()
            .with(Blocker::Unknown, !self.known)
            .with(
                Blocker::NotLive,
                matches!(state, None | Some(SwimState::Dead) | Some(SwimState::Left)),
            )
            .with(Blocker::Suspect, state == Some(SwimState::Suspect))
            .with(Blocker::NotAvailable, !self.available)
            .with(Blocker::NoIdentity, self.identity.is_none())
            .with(Blocker::Faulted, self.fault.is_some())
    }

    /// Why the node is not ready, as a change that made it so would say
    /// (the first blocker, in report order); `ViewChanged` when it is
    /// ready. For a node reported afresh, with no change to name.
    pub fn reason(&self) -> Reason {
        match self.verdict().blockers().next() {
            None => Reason::ViewChanged,
            Some(Blocker::Unknown) => Reason::Unknown,
            Some(Blocker::NotLive) => match self.membership.state() {
                Some(SwimState::Left) => Reason::Left,
                _ => Reason::Dead,
            },
            Some(Blocker::Suspect) => Reason::Suspect,
            Some(Blocker::NotAvailable) => Reason::Unavailable,
            Some(Blocker::NoIdentity) => Reason::NoIdentity,
            Some(Blocker::Faulted) => Reason::Faulted,
        }
    }

    /// The observations that bring a node's facts, whatever they are, to
    /// these (SWIM's as its precedence admits: never backwards): what a
    /// pool told a node's facts is told again when they changed meanwhile.
    pub fn as_statement(&self) -> Vec<Observation> {
        let mut said = Vec::new();
        match (self.known, self.identity) {
            (true, Some(_)) => said.push(Observation::Known),
            // Only `forgotten` clears an identity.
            (true, None) => said.extend([Observation::Forgotten, Observation::Known]),
            (false, _) => said.push(Observation::Forgotten),
        }
        if let Some(fingerprint) = self.identity {
            said.push(Observation::Identity(fingerprint));
        }
        if let Membership::Seen { state, incarnation } = self.membership {
            if state == SwimState::Suspect {
                said.push(Observation::Swim {
                    state: SwimState::Alive,
                    incarnation,
                });
            }
            said.push(Observation::Swim { state, incarnation });
        }
        said.push(match &self.fault {
            Some(reason) => Observation::Faulted {
                reason: FaultReason::new(reason),
            },
            None => Observation::Recovered,
        });
        said.push(match self.available {
            true => Observation::Available,
            false => Observation::Unavailable,
        });
        said
    }

    /// Whether the registry knows the node.
    pub fn is_known(&self) -> bool {
        self.known
    }

    /// The SWIM view of the node.
    pub fn membership(&self) -> Membership {
        self.membership
    }

    /// The fault reason, while faulted.
    pub fn fault(&self) -> Option<&str> {
        self.fault.as_deref()
    }

    /// The identity fingerprint, if any.
    pub fn fingerprint(&self) -> Option<Fingerprint> {
        self.identity
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn swim(state: SwimState, incarnation: u64) -> Observation {
        Observation::Swim { state, incarnation }
    }

    fn identity(bytes: &[u8]) -> Observation {
        Observation::Identity(Fingerprint::of(bytes))
    }

    fn ready_facts() -> NodeFacts {
        let mut facts = NodeFacts::default();
        for o in [
            Observation::Known,
            swim(SwimState::Alive, 1),
            Observation::Available,
            identity(b"key-1"),
        ] {
            facts.apply(o);
        }
        facts
    }

    fn changed(applied: Applied) -> NodeChange {
        match applied {
            Applied::Changed(change) => change,
            other => panic!("expected a change, got {other:?}"),
        }
    }

    fn facts_of(said: &[(u8, u8, u64)]) -> NodeFacts {
        let mut facts = NodeFacts::default();
        for &(kind, state, n) in said {
            let state = [
                SwimState::Alive,
                SwimState::Suspect,
                SwimState::Dead,
                SwimState::Left,
            ][state as usize % 4];
            facts.apply(match kind % 9 {
                0 => Observation::Known,
                1 => Observation::Forgotten,
                2 => Observation::Swim {
                    state,
                    incarnation: n,
                },
                3 => Observation::Available,
                4 => Observation::Unavailable,
                5 => Observation::Identity(Fingerprint::of(&[n as u8])),
                6 => Observation::Faulted {
                    reason: FaultReason::new(&format!("f{n}")),
                },
                7 => Observation::Recovered,
                _ => Observation::Swim {
                    state: SwimState::Alive,
                    incarnation: n + 1,
                },
            });
        }
        facts
    }

    proptest::proptest! {
        /// Told again over whatever a pool holds, a node's facts become
        /// these, SWIM's view as its precedence admits.
        #[test]
        fn a_nodes_facts_stated_over_any_others_are_these(
            before in proptest::collection::vec((0u8..9, 0u8..4, 0u64..4), 0..20),
            after in proptest::collection::vec((0u8..9, 0u8..4, 0u64..4), 0..20),
        ) {
            let (mut held, wanted) = (facts_of(&before), facts_of(&after));
            let admitted = match wanted.membership {
                Membership::Seen { state, incarnation } => held.membership == wanted.membership
                    || held.membership.admits(state, incarnation)
                    || (state == SwimState::Suspect && held.membership.admits(SwimState::Alive, incarnation)),
                Membership::NeverSeen => held.membership == Membership::NeverSeen,
            };
            for observation in wanted.as_statement() {
                held.apply(observation);
            }
            if admitted {
                proptest::prop_assert_eq!(held, wanted);
            } else {
                held.membership = wanted.membership;
                proptest::prop_assert_eq!(held, wanted);
            }
        }
    }

    #[test]
    fn a_node_with_no_facts_is_blocked_by_unknown_not_live_not_available_no_identity() {
        let verdict = NodeFacts::default().verdict();
        assert_eq!(verdict, Verdict::NOTHING_KNOWN);
        assert_eq!(
            verdict.blockers().collect::<Vec<_>>(),
            [
                Blocker::Unknown,
                Blocker::NotLive,
                Blocker::NotAvailable,
                Blocker::NoIdentity
            ]
        );
    }

    #[test]
    fn known_alive_available_with_identity_and_not_faulted_is_ready() {
        assert!(ready_facts().verdict().is_ready());
    }

    #[test]
    fn each_missing_fact_blocks_readiness() {
        let cases: [(Observation, Blocker); 6] = [
            (Observation::Forgotten, Blocker::Unknown),
            (swim(SwimState::Dead, 1), Blocker::NotLive),
            (swim(SwimState::Left, 1), Blocker::NotLive),
            (swim(SwimState::Suspect, 1), Blocker::Suspect),
            (Observation::Unavailable, Blocker::NotAvailable),
            (
                Observation::Faulted {
                    reason: FaultReason::new("ecc"),
                },
                Blocker::Faulted,
            ),
        ];
        for (observation, blocker) in cases {
            let mut facts = ready_facts();
            let change = changed(facts.apply(observation.clone()));
            assert!(change.before.is_ready());
            assert!(change.after.has(blocker), "{observation:?}");
            assert!(!change.after.is_ready());
        }
    }

    #[test]
    fn forgetting_a_node_clears_known_and_identity() {
        let mut facts = ready_facts();
        let change = changed(facts.apply(Observation::Forgotten));
        assert_eq!(change.reason, Reason::Unknown);
        assert!(change.after.has(Blocker::Unknown));
        assert!(change.after.has(Blocker::NoIdentity));
        assert_eq!(change.fingerprint, None);
    }

    #[test]
    fn a_fault_clears_availability_and_recovery_does_not_restore_it() {
        let mut facts = ready_facts();
        changed(facts.apply(Observation::Faulted {
            reason: FaultReason::new("ecc"),
        }));
        let change = changed(facts.apply(Observation::Recovered));
        assert!(change.after.has(Blocker::NotAvailable));
        assert!(!change.after.has(Blocker::Faulted));
        assert_eq!(facts.apply(Observation::Recovered), Applied::Duplicate);
    }

    #[test]
    fn repeated_observations_are_duplicates_not_changes() {
        let mut facts = ready_facts();
        for o in [
            Observation::Known,
            swim(SwimState::Alive, 1),
            Observation::Available,
            identity(b"key-1"),
            Observation::Recovered,
        ] {
            assert_eq!(facts.apply(o.clone()), Applied::Duplicate, "{o:?}");
        }
    }

    #[test]
    fn a_rotated_identity_is_a_change_that_keeps_the_node_ready() {
        let mut facts = ready_facts();
        let change = changed(facts.apply(identity(b"key-2")));
        assert_eq!(change.reason, Reason::IdentityChanged);
        assert!(change.after.is_ready());
        assert!(change.loses_required_node());
    }

    #[test]
    fn an_incarnation_bump_is_a_change_that_keeps_the_node_ready() {
        let mut facts = ready_facts();
        let change = changed(facts.apply(swim(SwimState::Alive, 2)));
        assert_eq!(change.reason, Reason::ViewChanged);
        assert!(change.after.is_ready());
        assert!(!change.loses_required_node());
    }

    /// The precedence table of design §1, row by row: (current, observed, admitted).
    #[test]
    fn swim_precedence_follows_the_spec_table() {
        use SwimState::*;
        let seen = |state, incarnation| Membership::Seen { state, incarnation };
        let rows: &[(Membership, SwimState, u64, bool)] = &[
            (Membership::NeverSeen, Alive, 0, true),
            (Membership::NeverSeen, Suspect, 0, false),
            (Membership::NeverSeen, Dead, 0, true),
            (Membership::NeverSeen, Left, 3, true),
            (seen(Alive, 2), Alive, 2, false),
            (seen(Alive, 2), Alive, 3, true),
            (seen(Alive, 2), Alive, 1, false),
            (seen(Alive, 2), Suspect, 2, true),
            (seen(Alive, 2), Suspect, 1, false),
            (seen(Alive, 2), Suspect, 5, true),
            (seen(Suspect, 2), Suspect, 2, false),
            (seen(Suspect, 2), Suspect, 3, true),
            (seen(Suspect, 2), Alive, 2, false),
            (seen(Suspect, 2), Alive, 3, true),
            (seen(Alive, 2), Dead, 2, true),
            (seen(Alive, 2), Dead, 1, false),
            (seen(Suspect, 2), Left, 2, true),
            (seen(Dead, 2), Dead, 2, false),
            (seen(Dead, 2), Left, 2, false),
            (seen(Left, 2), Dead, 2, false),
            (seen(Dead, 2), Dead, 3, true),
            (seen(Dead, 2), Suspect, 3, false),
            (seen(Dead, 2), Alive, 2, false),
            (seen(Dead, 2), Alive, 3, true),
            (seen(Left, 2), Alive, 3, true),
        ];
        for &(current, state, incarnation, admitted) in rows {
            assert_eq!(
                current.admits(state, incarnation),
                admitted,
                "{current:?} then {state:?}@{incarnation}"
            );
        }
    }

    #[test]
    fn a_delayed_suspicion_cannot_roll_back_a_refutation() {
        let mut facts = ready_facts();
        changed(facts.apply(swim(SwimState::Suspect, 1)));
        changed(facts.apply(swim(SwimState::Alive, 2)));
        assert_eq!(facts.apply(swim(SwimState::Suspect, 1)), Applied::Stale);
        assert!(facts.verdict().is_ready());
    }

    #[test]
    fn an_alive_at_a_higher_incarnation_after_dead_is_a_rejoin() {
        let mut facts = ready_facts();
        changed(facts.apply(swim(SwimState::Dead, 1)));
        assert_eq!(facts.apply(swim(SwimState::Alive, 1)), Applied::Stale);
        let change = changed(facts.apply(swim(SwimState::Alive, 2)));
        assert!(change.after.is_ready());
    }

    #[test]
    fn a_fault_reason_keeps_ordinary_text_as_it_is() {
        assert_eq!(
            FaultReason::new("ecc error on dimm 3").as_str(),
            "ecc error on dimm 3"
        );
    }

    #[test]
    fn a_fault_reason_replaces_control_characters() {
        assert_eq!(
            FaultReason::new("a\nb\u{7}c").as_str(),
            "a\u{fffd}b\u{fffd}c"
        );
    }

    #[test]
    fn a_long_fault_reason_is_cut_to_one_kib_on_a_character_boundary() {
        let reason = FaultReason::new(&"é".repeat(600));
        assert_eq!(reason.as_str().len(), MAX_REASON_BYTES);
        let reason = FaultReason::new(&format!("x{}", "é".repeat(600)));
        assert_eq!(reason.as_str().len(), MAX_REASON_BYTES - 1);
        assert!(reason.as_str().ends_with('é'));
        let replaced = FaultReason::new(&"\n".repeat(2000));
        assert_eq!(replaced.as_str().chars().count(), MAX_REASON_BYTES / 3);
    }
}
