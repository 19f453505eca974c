//! The pool's readiness and its convergence window (design §2).
//!
//! [`PoolReadiness`] keeps, per candidate, the latest verdict its node actor
//! reported, and a count of candidates that are not ready, so one change
//! costs O(1): no pass over the pool. `PoolReady` is due at `t0 + window`
//! where `t0` is the last view change, if every candidate was ready at `t0`.
//!
//! Calling contract: inputs stamped `T` are applied before timers due at `T`.
//! Every input method first fires deadlines strictly before its `at`
//! ([`PoolReadiness::settle_before`]); [`PoolReadiness::on_deadline`] fires
//! those at or before `now`. So the order in which an input and a timer
//! reach the actor does not matter, and a spurious or late timer is a no-op.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use crate::event::Event;
use crate::identity::Fingerprint;
use crate::ids::{Epoch, NodeId, PoolId};
use crate::node::{Membership, NodeChange, Reason, Verdict};
use crate::time::Time;

/// Why a pool definition was refused. The pool is unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DefinitionError {
    /// The member list was empty.
    #[error("the pool has no members")]
    NoMembers,
    /// A node was listed twice.
    #[error("node {0} is listed twice")]
    DuplicateMember(NodeId),
}

/// A candidate pool as the orchestrator defines it: an id and a non-empty
/// list of distinct nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolDefinition {
    id: PoolId,
    members: Vec<NodeId>,
}

impl PoolDefinition {
    /// Checks that `members` is non-empty and has no duplicates.
    pub fn new(id: PoolId, members: Vec<NodeId>) -> Result<Self, DefinitionError> {
        if members.is_empty() {
            return Err(DefinitionError::NoMembers);
        }
        let mut seen = HashSet::with_capacity(members.len());
        for member in &members {
            if !seen.insert(member) {
                return Err(DefinitionError::DuplicateMember(member.clone()));
            }
        }
        Ok(Self { id, members })
    }

    /// The pool's id.
    pub fn id(&self) -> &PoolId {
        &self.id
    }

    /// The candidates, in the order given.
    pub fn members(&self) -> &[NodeId] {
        &self.members
    }
}

/// Where a candidate's summary lives: a dense index plus a generation, so a
/// late message from a node actor of an earlier definition is recognised and
/// ignored.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct SlotKey {
    index: u32,
    generation: u32,
}

#[derive(Debug)]
struct Slot {
    id: Option<NodeId>,
    generation: u32,
    verdict: Verdict,
    fingerprint: Option<Fingerprint>,
    /// When the node last became ready or stopped being ready (for
    /// "blocked since" in reports).
    since: Time,
    detail: NodeDetail,
}

/// What a report shows of a node beyond its verdict: the SWIM state and
/// the fault reason.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeDetail {
    /// The SWIM view of the node.
    pub membership: Membership,
    /// The fault reason, while faulted.
    pub fault: Option<Arc<str>>,
}

impl Slot {
    fn live(&self, key: SlotKey) -> bool {
        self.generation == key.generation && self.id.is_some()
    }
}

/// One candidate as the pool sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CandidateSummary {
    /// The candidate's id.
    pub node: NodeId,
    /// Ready, or what blocks it.
    pub verdict: Verdict,
    /// Its identity fingerprint, if any.
    pub fingerprint: Option<Fingerprint>,
    /// Since when the node has been ready, or blocked (by anything).
    pub since: Time,
    /// SWIM state and fault reason.
    pub detail: NodeDetail,
}

impl CandidateSummary {
    /// What blocks the candidate, in words (`not_live (never seen) +
    /// no_identity`; empty when ready): the status answer's and the
    /// explainer's detail.
    pub fn blockers_in_words(&self) -> String {
        self.verdict
            .blockers()
            .map(|b| match (b.as_str(), &self.detail) {
                ("suspect", d) => match d.membership {
                    Membership::Seen { incarnation, .. } => format!("suspect (inc {incarnation})"),
                    Membership::NeverSeen => "suspect".to_string(),
                },
                ("not_live", d) => match d.membership {
                    Membership::Seen { state, .. } => format!("not_live ({state})"),
                    Membership::NeverSeen => "not_live (never seen)".to_string(),
                },
                ("faulted", d) => match &d.fault {
                    Some(reason) => format!("faulted ({reason})"),
                    None => "faulted".to_string(),
                },
                (name, _) => name.to_string(),
            })
            .collect::<Vec<_>>()
            .join(" + ")
    }
}

/// Where the pool stands.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum PoolPhase {
    /// Some candidate is not ready. Left when the last one becomes ready.
    Forming,
    /// Every candidate is ready; `PoolReady` is due at `deadline` unless the
    /// view changes first.
    Converging {
        /// When `PoolReady` is due.
        deadline: Time,
    },
    /// `PoolReady` was emitted with `epoch`; left at the next view change.
    Ready {
        /// The current epoch.
        epoch: Epoch,
    },
}

/// What a redefinition did to the candidate set.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Redefinition {
    /// New candidates, starting with no facts.
    pub added: Vec<(NodeId, SlotKey)>,
    /// Former candidates; their facts are dropped.
    pub removed: Vec<(NodeId, SlotKey)>,
}

/// The last view change, for explanations.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LastChange {
    /// The instant of the change: the start of the current window.
    pub at: Time,
    /// The node whose view changed; none for a redefinition or a restart.
    pub node: Option<NodeId>,
    /// What changed, as `readiness_lost` would word it.
    pub reason: Reason,
    /// Whether it cut a running window short (the pool was converging or
    /// ready): the one place that question is answered.
    pub restarted_window: bool,
}

/// The readiness of one candidate pool.
#[derive(Debug)]
pub struct PoolReadiness {
    id: PoolId,
    window: Duration,
    slots: Vec<Slot>,
    free: Vec<u32>,
    by_id: HashMap<NodeId, SlotKey>,
    not_ready: usize,
    phase: PoolPhase,
    last_epoch: u64,
    last_change: LastChange,
    now: Time,
}

impl PoolReadiness {
    /// A pool of `definition`'s candidates, none of them with any fact yet,
    /// so it starts forming. Returns the slots to start node actors for.
    pub fn new(
        definition: &PoolDefinition,
        window: Duration,
        now: Time,
    ) -> (Self, Vec<(NodeId, SlotKey)>) {
        let mut pool = Self {
            id: definition.id.clone(),
            window,
            slots: Vec::with_capacity(definition.members.len()),
            free: Vec::new(),
            by_id: HashMap::with_capacity(definition.members.len()),
            not_ready: 0,
            phase: PoolPhase::Forming,
            last_epoch: 0,
            last_change: LastChange {
                at: now,
                node: None,
                reason: Reason::PoolRedefined,
                restarted_window: false,
            },
            now,
        };
        let added = definition
            .members
            .iter()
            .map(|id| (id.clone(), pool.insert(id.clone(), now)))
            .collect();
        (pool, added)
    }

    /// Replaces the candidate set (design §2): nodes that stay keep their
    /// summary, new ones start with none, readiness restarts.
    pub fn redefine(
        &mut self,
        definition: &PoolDefinition,
        at: Time,
        out: &mut Vec<Event>,
    ) -> Redefinition {
        let at = self.settle_before(at, out);
        let wanted: HashSet<&NodeId> = definition.members.iter().collect();
        let mut change = Redefinition::default();
        let leaving: Vec<NodeId> = self
            .by_id
            .keys()
            .filter(|id| !wanted.contains(id))
            .cloned()
            .collect();
        for id in leaving {
            if let Some(key) = self.remove(&id) {
                change.removed.push((id, key));
            }
        }
        for id in &definition.members {
            if !self.by_id.contains_key(id) {
                change.added.push((id.clone(), self.insert(id.clone(), at)));
            }
        }
        self.view_changed(at, None, Reason::PoolRedefined, out);
        self.id = definition.id.clone();
        change
    }

    /// A candidate's node actor reports a change of its view; returns the
    /// verdict it replaced. A key from an earlier definition is ignored
    /// (returns `None`).
    pub fn node_changed(
        &mut self,
        key: SlotKey,
        at: Time,
        change: &NodeChange,
        out: &mut Vec<Event>,
    ) -> Option<Verdict> {
        let at = self.settle_before(at, out);
        let slot = self.slot_mut(key)?;
        let before = slot.verdict;
        let was_ready = before.is_ready();
        if slot.verdict.is_ready() != change.after.is_ready() {
            slot.since = at;
        }
        slot.verdict = change.after;
        slot.fingerprint = change.fingerprint;
        let node = slot.id.clone();
        match (was_ready, change.after.is_ready()) {
            (true, false) => self.not_ready += 1,
            (false, true) => self.not_ready -= 1,
            _ => {}
        }
        self.view_changed(at, node, change.reason, out);
        Some(before)
    }

    /// Forgets every candidate's summary, as after a restart of the pool's
    /// actor: readiness starts over (the node actors report again), the
    /// epoch counter keeps rising so no proof from before can commit.
    pub fn restart(&mut self, at: Time, out: &mut Vec<Event>) {
        let at = self.settle_before(at, out);
        for slot in self.slots.iter_mut().filter(|s| s.id.is_some()) {
            slot.verdict = Verdict::NOTHING_KNOWN;
            slot.fingerprint = None;
            slot.since = at;
            slot.detail = NodeDetail::default();
        }
        self.not_ready = self.by_id.len();
        self.view_changed(at, None, Reason::ViewChanged, out);
    }

    /// Records what a report shows of a candidate besides its verdict.
    pub fn set_detail(&mut self, key: SlotKey, detail: NodeDetail) {
        if let Some(slot) = self.slot_mut(key) {
            slot.detail = detail;
        }
    }

    /// The latest verdict of a candidate's slot (`None` for a stale key).
    pub fn verdict_of(&self, key: SlotKey) -> Option<Verdict> {
        self.slot(key).map(|s| s.verdict)
    }

    /// A timer armed for `now` fired: fires the convergence deadline if it
    /// is due at or before `now`.
    ///
    /// Only the timer's own instant counts, never the latest input's: a
    /// timer armed for an earlier deadline that fires after an input stamped
    /// `T` was applied must not fire a deadline due at `T`, because inputs
    /// stamped `T` come before timers due at `T` (design §2). A timer that
    /// finds nothing due is a no-op; the caller re-arms it.
    pub fn on_deadline(&mut self, now: Time, out: &mut Vec<Event>) {
        if let PoolPhase::Converging { deadline } = self.phase {
            if deadline <= now {
                self.become_ready(deadline, out);
            }
        }
        self.now = self.now.max(now);
    }

    /// Fires the convergence deadline if it is due strictly before `at`, the
    /// time of an input; returns the time the input is applied at (never
    /// earlier than anything seen).
    pub fn settle_before(&mut self, at: Time, out: &mut Vec<Event>) -> Time {
        if let PoolPhase::Converging { deadline } = self.phase {
            if deadline < at {
                self.become_ready(deadline, out);
            }
        }
        self.now = self.now.max(at);
        self.now
    }

    /// When the next timer is due, if any.
    pub fn deadline(&self) -> Option<Time> {
        match self.phase {
            PoolPhase::Converging { deadline } => Some(deadline),
            _ => None,
        }
    }

    /// Where the pool stands.
    pub fn phase(&self) -> PoolPhase {
        self.phase
    }

    /// The last epoch issued (0 before the first `PoolReady`).
    pub fn last_epoch(&self) -> u64 {
        self.last_epoch
    }

    /// Continues the epochs above `issued` (those a gate issued before a
    /// restart): the next `PoolReady` carries a higher one.
    pub fn resume_epochs_after(&mut self, issued: u64) {
        self.last_epoch = self.last_epoch.max(issued);
    }

    /// The current epoch while ready.
    pub fn ready_epoch(&self) -> Option<Epoch> {
        match self.phase {
            PoolPhase::Ready { epoch } => Some(epoch),
            _ => None,
        }
    }

    /// The pool's id.
    pub fn id(&self) -> &PoolId {
        &self.id
    }

    /// The convergence window.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// The last view change.
    pub fn last_change(&self) -> &LastChange {
        &self.last_change
    }

    /// Whether `node` is a candidate.
    pub fn is_candidate(&self, node: &NodeId) -> bool {
        self.by_id.contains_key(node)
    }

    /// The slot of candidate `node`, if it is one.
    pub fn key_of(&self, node: &NodeId) -> Option<SlotKey> {
        self.by_id.get(node).copied()
    }

    /// How many candidates there are, and how many of them are not ready.
    pub fn counts(&self) -> (usize, usize) {
        (self.by_id.len(), self.not_ready)
    }

    /// Every candidate with its latest verdict, sorted by id.
    pub fn candidates(&self) -> Vec<CandidateSummary> {
        let mut all: Vec<_> = self
            .slots
            .iter()
            .filter_map(|s| {
                Some(CandidateSummary {
                    node: s.id.clone()?,
                    verdict: s.verdict,
                    fingerprint: s.fingerprint,
                    since: s.since,
                    detail: s.detail.clone(),
                })
            })
            .collect();
        all.sort_by(|a, b| a.node.cmp(&b.node));
        all
    }

    fn become_ready(&mut self, at: Time, out: &mut Vec<Event>) {
        let Some(next) = self.last_epoch.checked_add(1) else {
            // Every epoch has been issued (a restored `last_epoch` of
            // u64::MAX): none is told again, so the pool is never ready.
            self.phase = PoolPhase::Forming;
            return;
        };
        self.last_epoch = next;
        let epoch = Epoch(self.last_epoch);
        self.phase = PoolPhase::Ready { epoch };
        let candidates = self.candidates();
        let fingerprints: BTreeMap<NodeId, Fingerprint> = candidates
            .iter()
            .filter_map(|c| Some((c.node.clone(), c.fingerprint?)))
            .collect();
        out.push(Event::PoolReady {
            at,
            pool: self.id.clone(),
            epoch,
            members: candidates.into_iter().map(|c| c.node).collect(),
            fingerprints,
        });
    }

    fn view_changed(
        &mut self,
        at: Time,
        node: Option<NodeId>,
        reason: Reason,
        out: &mut Vec<Event>,
    ) {
        if let PoolPhase::Ready { epoch } = self.phase {
            out.push(Event::ReadinessLost {
                at,
                pool: self.id.clone(),
                epoch,
                node: node.clone(),
                reason,
            });
        }
        let restarted_window = matches!(
            self.phase,
            PoolPhase::Converging { .. } | PoolPhase::Ready { .. }
        );
        self.last_change = LastChange {
            at,
            node,
            reason,
            restarted_window,
        };
        self.phase = if self.not_ready == 0 {
            PoolPhase::Converging {
                deadline: at + self.window,
            }
        } else {
            PoolPhase::Forming
        };
    }

    fn insert(&mut self, id: NodeId, at: Time) -> SlotKey {
        let index = match self.free.pop() {
            Some(index) => index,
            None => {
                self.slots.push(Slot {
                    id: None,
                    generation: 0,
                    verdict: Verdict::NOTHING_KNOWN,
                    fingerprint: None,
                    since: at,
                    detail: NodeDetail::default(),
                });
                u32::try_from(self.slots.len() - 1).unwrap_or(u32::MAX)
            }
        };
        let slot = &mut self.slots[index as usize];
        slot.id = Some(id.clone());
        slot.verdict = Verdict::NOTHING_KNOWN;
        slot.fingerprint = None;
        slot.since = at;
        slot.detail = NodeDetail::default();
        let key = SlotKey {
            index,
            generation: slot.generation,
        };
        self.by_id.insert(id, key);
        self.not_ready += 1;
        key
    }

    fn remove(&mut self, id: &NodeId) -> Option<SlotKey> {
        let key = self.by_id.remove(id)?;
        let slot = &mut self.slots[key.index as usize];
        if !slot.verdict.is_ready() {
            self.not_ready -= 1;
        }
        slot.id = None;
        slot.generation = slot.generation.wrapping_add(1);
        slot.fingerprint = None;
        self.free.push(key.index);
        Some(key)
    }

    /// The live slot of `key`: same generation, still a candidate.
    fn slot(&self, key: SlotKey) -> Option<&Slot> {
        self.slots.get(key.index as usize).filter(|s| s.live(key))
    }

    fn slot_mut(&mut self, key: SlotKey) -> Option<&mut Slot> {
        self.slots
            .get_mut(key.index as usize)
            .filter(|s| s.live(key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::{Applied, NodeFacts, Observation, SwimState};
    use crate::test_support::{node, t};
    use crate::IdentityMaterial;

    const WINDOW: Duration = Duration::from_secs(5);

    /// A pool plus each candidate's facts, driven as the actors drive them.
    struct Harness {
        pool: PoolReadiness,
        facts: HashMap<NodeId, (SlotKey, NodeFacts)>,
        events: Vec<Event>,
    }

    impl Harness {
        fn new(members: &[&str]) -> Self {
            let definition = PoolDefinition::new(
                PoolId::new("p").unwrap(),
                members.iter().map(|m| node(m)).collect(),
            )
            .unwrap();
            let (pool, added) = PoolReadiness::new(&definition, WINDOW, Time::ZERO);
            let facts = added
                .into_iter()
                .map(|(id, key)| (id, (key, NodeFacts::default())))
                .collect();
            Self {
                pool,
                facts,
                events: Vec::new(),
            }
        }

        fn observe(&mut self, at: Time, name: &str, observation: Observation) {
            let (key, facts) = self.facts.get_mut(&node(name)).unwrap();
            if let Applied::Changed(change) = facts.apply(observation) {
                self.pool.node_changed(*key, at, &change, &mut self.events);
            }
        }

        fn make_ready(&mut self, at: Time, name: &str) {
            self.observe(at, name, Observation::Known);
            self.observe(
                at,
                name,
                Observation::Swim {
                    state: SwimState::Alive,
                    incarnation: 1,
                },
            );
            self.observe(at, name, Observation::Available);
            let material = IdentityMaterial::new(format!("key-{name}").into_bytes()).unwrap();
            self.observe(at, name, Observation::Identity(material.fingerprint()));
        }

        /// A refuted-style incarnation bump: a change that keeps `name` ready.
        fn bump(&mut self, at: Time, name: &str, incarnation: u64) {
            let observation = Observation::Swim {
                state: SwimState::Alive,
                incarnation,
            };
            self.observe(at, name, observation);
        }

        fn tick(&mut self, now: Time) {
            self.pool.on_deadline(now, &mut self.events);
        }

        fn names(&self) -> Vec<&'static str> {
            self.events.iter().map(Event::name).collect()
        }
    }

    #[test]
    fn pool_ready_comes_at_the_last_change_plus_the_window() {
        let mut h = Harness::new(&["a", "b"]);
        h.make_ready(t(0), "a");
        h.make_ready(t(100), "b");
        assert_eq!(h.pool.deadline(), Some(t(5100)));
        h.tick(t(5099));
        assert!(h.events.is_empty());
        h.tick(t(5100));
        match &h.events[..] {
            [Event::PoolReady {
                at,
                epoch,
                members,
                fingerprints,
                ..
            }] => {
                assert_eq!(*at, t(5100));
                assert_eq!(*epoch, Epoch(1));
                assert_eq!(members, &[node("a"), node("b")]);
                assert_eq!(
                    fingerprints[&node("a")],
                    Fingerprint::of(b"key-a"),
                    "fingerprint of a's material"
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_pool_with_a_blocked_candidate_never_becomes_ready() {
        let mut h = Harness::new(&["a", "b"]);
        h.make_ready(t(0), "a");
        h.observe(t(0), "b", Observation::Known);
        assert_eq!(h.pool.phase(), PoolPhase::Forming);
        assert_eq!(h.pool.deadline(), None);
        h.tick(t(60_000));
        assert!(h.events.is_empty());
    }

    #[test]
    fn a_change_inside_the_window_restarts_it() {
        let mut h = Harness::new(&["a"]);
        h.make_ready(t(0), "a");
        h.bump(t(3000), "a", 2);
        h.tick(t(5000));
        assert!(h.events.is_empty());
        h.tick(t(8000));
        assert_eq!(h.names(), ["pool_ready"]);
    }

    #[test]
    fn a_change_exactly_at_the_deadline_restarts_the_window() {
        let mut h = Harness::new(&["a"]);
        h.make_ready(t(0), "a");
        // Input stamped at the deadline: applied before the timer.
        h.bump(t(5000), "a", 2);
        h.tick(t(5000));
        assert!(h.events.is_empty());
        assert_eq!(h.pool.deadline(), Some(t(10_000)));
    }

    #[test]
    fn a_timer_armed_earlier_does_not_fire_a_deadline_due_at_the_latest_input() {
        let mut h = Harness::new(&["a"]);
        h.make_ready(t(0), "a");
        h.bump(t(1), "a", 2);
        // A command is settled at the new deadline (5001): nothing is due
        // strictly before it.
        h.pool.settle_before(t(5001), &mut h.events);
        // The timer still armed for the old deadline fires late.
        h.tick(t(5000));
        assert!(h.events.is_empty(), "{:?}", h.events);
        assert_eq!(h.pool.deadline(), Some(t(5001)));
        h.tick(t(5001));
        assert_eq!(h.names(), ["pool_ready"]);
    }

    #[test]
    fn an_input_after_a_missed_deadline_fires_it_first() {
        let mut h = Harness::new(&["a"]);
        h.make_ready(t(0), "a");
        h.observe(t(5001), "a", Observation::Unavailable);
        assert_eq!(h.names(), ["pool_ready", "readiness_lost"]);
        assert_eq!(h.events[0].at(), t(5000));
    }

    #[test]
    fn a_duplicate_does_not_restart_the_window() {
        let mut h = Harness::new(&["a"]);
        h.make_ready(t(0), "a");
        h.make_ready(t(4000), "a");
        h.tick(t(5000));
        assert_eq!(h.names(), ["pool_ready"]);
    }

    #[test]
    fn any_change_while_ready_loses_readiness_with_the_node_and_reason() {
        let mut h = Harness::new(&["a", "b"]);
        h.make_ready(t(0), "a");
        h.make_ready(t(0), "b");
        h.tick(t(5000));
        h.observe(
            t(6000),
            "b",
            Observation::Swim {
                state: SwimState::Suspect,
                incarnation: 1,
            },
        );
        match &h.events[1] {
            Event::ReadinessLost {
                epoch,
                node: n,
                reason,
                ..
            } => {
                assert_eq!(*epoch, Epoch(1));
                assert_eq!(n.as_ref(), Some(&node("b")));
                assert_eq!(*reason, Reason::Suspect);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(h.pool.phase(), PoolPhase::Forming);
    }

    #[test]
    fn a_new_readiness_gets_a_new_epoch() {
        let mut h = Harness::new(&["a"]);
        h.make_ready(t(0), "a");
        h.tick(t(5000));
        h.observe(t(6000), "a", Observation::Unavailable);
        h.observe(t(7000), "a", Observation::Available);
        h.tick(t(12_000));
        assert_eq!(h.pool.ready_epoch(), Some(Epoch(2)));
    }

    #[test]
    fn redefinition_keeps_staying_nodes_and_starts_new_ones_blank() {
        let mut h = Harness::new(&["a", "b"]);
        h.make_ready(t(0), "a");
        h.make_ready(t(0), "b");
        h.tick(t(5000));
        let definition =
            PoolDefinition::new(PoolId::new("q").unwrap(), vec![node("a"), node("c")]).unwrap();
        let change = h.pool.redefine(&definition, t(6000), &mut h.events);
        assert_eq!(change.removed.len(), 1);
        assert_eq!(change.added.len(), 1);
        match &h.events[1] {
            Event::ReadinessLost {
                node, reason, pool, ..
            } => {
                assert_eq!(*node, None);
                assert_eq!(*reason, Reason::PoolRedefined);
                assert_eq!(pool.as_str(), "p");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(h.pool.counts(), (2, 1));
        assert!(!h.pool.is_candidate(&node("b")));
        // A late change from b's old slot is ignored.
        let (b_key, _) = h.facts[&node("b")];
        let change = NodeChange {
            reason: Reason::Unavailable,
            before: Verdict::default(),
            after: Verdict::NOTHING_KNOWN,
            fingerprint: None,
        };
        assert_eq!(
            h.pool.node_changed(b_key, t(6001), &change, &mut h.events),
            None
        );
    }

    #[test]
    fn redefining_to_a_subset_of_ready_nodes_converges_again() {
        let mut h = Harness::new(&["a", "b"]);
        h.make_ready(t(0), "a");
        h.observe(t(0), "b", Observation::Known);
        let definition = PoolDefinition::new(PoolId::new("p").unwrap(), vec![node("a")]).unwrap();
        h.pool.redefine(&definition, t(1000), &mut h.events);
        assert_eq!(h.pool.deadline(), Some(t(6000)));
    }

    #[test]
    fn a_restart_forgets_every_summary_and_keeps_the_epoch_rising() {
        let mut h = Harness::new(&["a"]);
        h.make_ready(t(0), "a");
        h.tick(t(5000));
        h.pool.restart(t(6000), &mut h.events);
        assert_eq!(h.names(), ["pool_ready", "readiness_lost"]);
        assert_eq!(h.pool.phase(), PoolPhase::Forming);
        let key = h.facts[&node("a")].0;
        assert_eq!(h.pool.verdict_of(key), Some(Verdict::NOTHING_KNOWN));
        // The node actor reports its facts again: a fresh window, epoch 2.
        let facts = h.facts[&node("a")].1.clone();
        let change = NodeChange {
            reason: Reason::ViewChanged,
            before: Verdict::NOTHING_KNOWN,
            after: facts.verdict(),
            fingerprint: facts.fingerprint(),
        };
        h.pool.node_changed(key, t(6000), &change, &mut h.events);
        h.tick(t(11_000));
        assert_eq!(h.pool.ready_epoch(), Some(Epoch(2)));
    }

    #[test]
    fn pool_definitions_need_distinct_members() {
        let id = PoolId::new("p").unwrap();
        assert_eq!(
            PoolDefinition::new(id.clone(), vec![]),
            Err(DefinitionError::NoMembers)
        );
        assert_eq!(
            PoolDefinition::new(id, vec![node("a"), node("a")]),
            Err(DefinitionError::DuplicateMember(node("a")))
        );
    }
}
