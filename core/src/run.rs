//! The guard of one run (design §3): planning only on a ready pool, the
//! wait/abort policy when readiness is lost before commit, and fault handling
//! for the required nodes once the plan is committed.
//!
//! Calling contract, as for the pool: every input first fires the wait
//! deadline if it fell strictly before the input's `at`; `on_deadline` fires
//! it at or before `now`. A `PoolReady` at the very instant the wait runs out
//! is an input at that instant, so it wins (design §3).

use std::collections::BTreeMap;
use std::time::Duration;

use crate::event::{AbortReason, Event};
use crate::identity::Fingerprint;
use crate::ids::{Epoch, NodeId, PoolId, RunId};
use crate::node::NodeChange;
use crate::time::Time;

/// What planning does when the pool stops being ready before commit.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum OnReadinessLost {
    /// Suspend planning until the pool is ready again (or `wait_timeout`).
    Wait,
    /// Abort planning at once.
    Abort,
}

impl OnReadinessLost {
    /// The policy's name, as `config.toml` and the replay format spell it.
    pub const fn name(self) -> &'static str {
        match self {
            OnReadinessLost::Wait => "wait",
            OnReadinessLost::Abort => "abort",
        }
    }

    /// The policy of a name; the error says which names there are.
    pub fn from_name(name: &str) -> Result<Self, String> {
        [OnReadinessLost::Wait, OnReadinessLost::Abort]
            .into_iter()
            .find(|policy| policy.name() == name)
            .ok_or_else(|| format!("`{name}` is not a policy; use \"wait\" or \"abort\""))
    }
}

/// The local planning policy (config `[planning]`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct PlanningPolicy {
    /// Wait or abort.
    pub on_readiness_lost: OnReadinessLost,
    /// How long to wait, under `Wait`; `None` waits forever.
    pub wait_timeout: Option<Duration>,
}

/// A command that was refused. Nothing changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    /// Planning and commit need a ready pool.
    #[error("the pool is not ready")]
    PoolNotReady,
    /// One run at a time per pool.
    #[error("run {0} is in progress")]
    RunInProgress(RunId),
    /// The run is not the pool's active run.
    #[error("run {0} is not active")]
    UnknownRun(RunId),
    /// The epoch given is not the current one.
    #[error("epoch {given} is not the current epoch{}", current.map(|e| format!(" {e}")).unwrap_or_default())]
    StaleEpoch {
        /// The epoch the caller gave.
        given: Epoch,
        /// The current epoch, if the pool is ready.
        current: Option<Epoch>,
    },
    /// Commit needs a run that is planning (not suspended, not committed).
    #[error("run {run} is {state}, not planning")]
    NotPlanning {
        /// The refused run.
        run: RunId,
        /// Its state: `suspended` or `committed`.
        state: &'static str,
    },
    /// Finish needs a committed run.
    #[error("run {run} is {state}, not committed")]
    NotCommitted {
        /// The refused run.
        run: RunId,
        /// Its state: `planning` or `suspended`.
        state: &'static str,
    },
    /// A required node is not a candidate.
    #[error("node {0} is not a candidate of the pool")]
    NotCandidate(NodeId),
    /// The pool cannot be redefined under a committed run.
    #[error("run {0} is committed; the pool cannot be redefined")]
    RunCommitted(RunId),
    /// A plan must require at least one node: a plan that requires none
    /// could never fault.
    #[error("the plan of run {0} requires no node")]
    InvalidPlan(RunId),
    /// A required node serves another pool's committed run (design §14: a
    /// node serves one committed run at a time).
    #[error("node {node} is reserved by run {run} of pool {pool}")]
    Reserved {
        /// The node.
        node: NodeId,
        /// The committed run that holds it.
        run: RunId,
        /// That run's pool.
        pool: PoolId,
    },
}

impl Refusal {
    /// A short stable code for the replay's `rejected` event.
    pub fn code(&self) -> &'static str {
        match self {
            Refusal::PoolNotReady => "pool_not_ready",
            Refusal::RunInProgress(_) => "run_in_progress",
            Refusal::UnknownRun(_) => "unknown_run",
            Refusal::StaleEpoch { .. } => "stale_epoch",
            Refusal::NotPlanning { .. } => "run_not_planning",
            Refusal::NotCommitted { .. } => "run_not_committed",
            Refusal::NotCandidate(_) => "not_candidate",
            Refusal::RunCommitted(_) => "run_committed",
            Refusal::InvalidPlan(_) => "invalid_plan",
            Refusal::Reserved { .. } => "reserved",
        }
    }
}

/// How a run ended.
#[derive(Clone, PartialEq, Eq, Debug)]
#[non_exhaustive]
pub enum RunEnd {
    /// Planning was abandoned.
    Aborted(AbortReason),
    /// A required node was lost after commit.
    Faulted,
    /// The run finished.
    Finished,
}

/// Where a run stands.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum RunPhase {
    /// Planning on a ready pool at `epoch`. Left by commit or readiness loss.
    Planning {
        /// The epoch planning is bound to.
        epoch: Epoch,
    },
    /// Readiness was lost under `wait`. Left by `PoolReady` (back to
    /// planning) or by the deadline (aborted).
    Suspended {
        /// When waiting gives up; `None` waits forever.
        deadline: Option<Time>,
    },
    /// Provisioning began. Left by a required node's loss or by finish.
    Committed {
        /// The epoch the plan was made on.
        epoch: Epoch,
    },
    /// Final.
    Ended(RunEnd),
}

impl RunPhase {
    /// The phase's name, as refusals word it.
    pub fn name(&self) -> &'static str {
        match self {
            RunPhase::Planning { .. } => "planning",
            RunPhase::Suspended { .. } => "suspended",
            RunPhase::Committed { .. } => "committed",
            RunPhase::Ended(_) => "ended",
        }
    }
}

/// A plan's required nodes: sorted, each once, never empty. Made once,
/// when a commit is admitted; the stored run, the run's guard and
/// `run_committed` all read this one value.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequiredNodes(Vec<NodeId>);

impl RequiredNodes {
    /// The plan's nodes, sorted and each once; `None` for an empty plan
    /// (`invalid_plan`).
    pub fn new(mut nodes: Vec<NodeId>) -> Option<Self> {
        Self::in_order(&mut nodes, |node| node);
        (!nodes.is_empty()).then_some(Self(nodes))
    }

    /// Puts `entries` in a required set's order: sorted by node, each
    /// node once (its first entry). The one rule, for the set and for a
    /// stored run's entries (node and fingerprint).
    pub(crate) fn in_order<T>(entries: &mut Vec<T>, node: impl Fn(&T) -> &NodeId) {
        entries.sort_by(|a, b| node(a).cmp(node(b)));
        entries.dedup_by(|a, b| node(a) == node(b));
    }

    /// Whether `node` is one of them.
    pub fn contains(&self, node: &NodeId) -> bool {
        self.0.binary_search(node).is_ok()
    }

    /// The nodes, sorted.
    pub fn as_slice(&self) -> &[NodeId] {
        &self.0
    }
}

/// The guard of one run.
#[derive(Debug)]
pub struct RunGuard {
    run: RunId,
    /// The pool it is on (a planning run's pool may be redefined).
    pool: PoolId,
    policy: PlanningPolicy,
    phase: RunPhase,
    /// Empty until the plan is committed.
    required: RequiredNodes,
    /// After a restart: required nodes not yet seen ready with their
    /// committed fingerprint, and until when they may take.
    unconfirmed: BTreeMap<NodeId, Option<Fingerprint>>,
    confirm_by: Option<Time>,
}

impl RunGuard {
    /// Starts planning `run` on the pool's current `epoch`. The caller has
    /// checked that the pool is ready and no other run is active.
    pub fn begin(
        run: RunId,
        pool: PoolId,
        epoch: Epoch,
        policy: PlanningPolicy,
        at: Time,
        out: &mut Vec<Event>,
    ) -> Self {
        out.push(Event::PlanningStarted {
            at,
            pool: pool.clone(),
            run: run.clone(),
            epoch,
        });
        Self {
            run,
            pool,
            policy,
            phase: RunPhase::Planning { epoch },
            required: RequiredNodes::default(),
            unconfirmed: BTreeMap::new(),
            confirm_by: None,
        }
    }

    /// A committed run restored after a restart of the gate (design §9): it
    /// is guarded again, and each required node must be seen ready with its
    /// committed fingerprint by `confirm_by`, else the run faults
    /// (`unconfirmed`); a different fingerprint is `identity_changed`, and
    /// a node's own word that it is lost (a fault, or its availability
    /// withdrawn) faults the run at once.
    pub fn restored(
        run: RunId,
        pool: PoolId,
        epoch: Epoch,
        required: Vec<(NodeId, Option<Fingerprint>)>,
        policy: PlanningPolicy,
        confirm_by: Time,
    ) -> Self {
        Self {
            run,
            pool,
            policy,
            phase: RunPhase::Committed { epoch },
            required: RequiredNodes::new(required.iter().map(|(n, _)| n.clone()).collect())
                .unwrap_or_default(),
            unconfirmed: required.into_iter().collect(),
            confirm_by: Some(confirm_by),
        }
    }

    /// The pool became ready at `epoch`.
    pub fn pool_ready(&mut self, at: Time, epoch: Epoch, out: &mut Vec<Event>) {
        self.settle_before(at, out);
        if let RunPhase::Suspended { .. } = self.phase {
            self.phase = RunPhase::Planning { epoch };
            out.push(Event::PlanningResumed {
                at,
                pool: self.pool.clone(),
                run: self.run.clone(),
                epoch,
            });
        }
    }

    /// The pool stopped being ready.
    pub fn readiness_lost(&mut self, at: Time, out: &mut Vec<Event>) {
        self.settle_before(at, out);
        if let RunPhase::Planning { .. } = self.phase {
            match self.policy.on_readiness_lost {
                OnReadinessLost::Abort => self.abort(at, AbortReason::ReadinessLost, out),
                OnReadinessLost::Wait => {
                    self.phase = RunPhase::Suspended {
                        deadline: self.policy.wait_timeout.map(|t| at + t),
                    };
                    out.push(Event::PlanningSuspended {
                        at,
                        pool: self.pool.clone(),
                        run: self.run.clone(),
                    });
                }
            }
        }
    }

    /// A candidate's view changed. After commit, the loss of a required node
    /// faults the run at once (design §3); other nodes do not matter.
    pub fn node_changed(
        &mut self,
        at: Time,
        node: &NodeId,
        change: &NodeChange,
        out: &mut Vec<Event>,
    ) {
        self.settle_before(at, out);
        if let Some(committed) = self.unconfirmed.get(node).cloned() {
            if change.after.is_ready() {
                if change.fingerprint != committed {
                    return self.fault(at, node, super::node::Reason::IdentityChanged, out);
                }
                self.unconfirmed.remove(node);
                if self.unconfirmed.is_empty() {
                    self.confirm_by = None;
                }
            } else if matches!(
                change.reason,
                super::node::Reason::Faulted | super::node::Reason::Unavailable
            ) {
                // The node's own word that it is lost (a fault, or the
                // availability it gave since the restart withdrawn): not a
                // view still forming, so the grace is not waited out.
                return self.fault(at, node, change.reason, out);
            }
            // Not seen ready yet: the grace period is still running.
            return;
        }
        if let RunPhase::Committed { .. } = self.phase {
            if self.required.contains(node) && change.loses_required_node() {
                self.fault(at, node, change.reason, out);
            }
        }
    }

    /// Commits the plan: provisioning begins and the run takes over fault
    /// handling of `required`. The caller has checked that the pool is ready
    /// at `pool_epoch` and that every required node is a candidate.
    pub fn commit(
        &mut self,
        at: Time,
        required: RequiredNodes,
        pool_epoch: Epoch,
        out: &mut Vec<Event>,
    ) -> Result<(), Refusal> {
        self.settle_before(at, out);
        match self.phase {
            RunPhase::Planning { epoch } if epoch == pool_epoch => {}
            RunPhase::Planning { epoch } => {
                return Err(Refusal::StaleEpoch {
                    given: epoch,
                    current: Some(pool_epoch),
                })
            }
            ref other => {
                return Err(Refusal::NotPlanning {
                    run: self.run.clone(),
                    state: other.name(),
                })
            }
        }
        self.phase = RunPhase::Committed { epoch: pool_epoch };
        out.push(Event::RunCommitted {
            at,
            pool: self.pool.clone(),
            run: self.run.clone(),
            epoch: pool_epoch,
            required: required.as_slice().to_vec(),
        });
        self.required = required;
        Ok(())
    }

    /// Ends a committed run.
    pub fn finish(&mut self, at: Time, out: &mut Vec<Event>) -> Result<(), Refusal> {
        self.settle_before(at, out);
        if !matches!(self.phase, RunPhase::Committed { .. }) {
            return Err(Refusal::NotCommitted {
                run: self.run.clone(),
                state: self.phase.name(),
            });
        }
        self.phase = RunPhase::Ended(RunEnd::Finished);
        out.push(Event::RunFinished {
            at,
            pool: self.pool.clone(),
            run: self.run.clone(),
        });
        Ok(())
    }

    /// The restored run's confirmation deadline is due at `now`: any
    /// required node still unconfirmed faults the run (`unconfirmed`).
    pub fn on_confirm_deadline(&mut self, now: Time, out: &mut Vec<Event>) {
        let Some(deadline) = self.confirm_by.filter(|d| *d <= now) else {
            return;
        };
        self.confirm_by = None;
        if let Some(node) = self.unconfirmed.keys().next().cloned() {
            self.fault(deadline, &node, super::node::Reason::Unconfirmed, out);
        }
    }

    /// When a restored run's confirmation is due, while some required node
    /// is unconfirmed.
    pub fn confirm_by(&self) -> Option<Time> {
        self.confirm_by
    }

    fn fault(
        &mut self,
        at: Time,
        node: &NodeId,
        reason: super::node::Reason,
        out: &mut Vec<Event>,
    ) {
        if !matches!(self.phase, RunPhase::Committed { .. }) {
            return;
        }
        self.phase = RunPhase::Ended(RunEnd::Faulted);
        self.unconfirmed.clear();
        self.confirm_by = None;
        out.push(Event::RunFaulted {
            at,
            pool: self.pool.clone(),
            run: self.run.clone(),
            node: node.clone(),
            reason,
        });
    }

    /// Fires the wait deadline if it is due at or before `now`.
    pub fn on_deadline(&mut self, now: Time, out: &mut Vec<Event>) {
        if let Some(deadline) = self.deadline() {
            if deadline <= now {
                self.abort(deadline, AbortReason::WaitTimeout, out);
            }
        }
    }

    /// Fires the wait deadline if it is due strictly before `at`.
    pub fn settle_before(&mut self, at: Time, out: &mut Vec<Event>) {
        if let Some(deadline) = self.deadline() {
            if deadline < at {
                self.abort(deadline, AbortReason::WaitTimeout, out);
            }
        }
    }

    /// When the next timer is due, if any.
    pub fn deadline(&self) -> Option<Time> {
        match self.phase {
            RunPhase::Suspended { deadline } => deadline,
            _ => None,
        }
    }

    /// The run this guard keeps.
    pub fn run(&self) -> &RunId {
        &self.run
    }

    /// Where the run stands.
    pub fn phase(&self) -> &RunPhase {
        &self.phase
    }

    /// Whether the run is over.
    pub fn is_ended(&self) -> bool {
        matches!(self.phase, RunPhase::Ended(_))
    }

    /// The pool the run is on.
    pub fn pool(&self) -> &PoolId {
        &self.pool
    }

    /// A planning run's pool was redefined under a new id: its events
    /// name the new one.
    pub fn moved_to(&mut self, pool: PoolId) {
        self.pool = pool;
    }

    /// Whether `node` is required by the committed plan.
    pub fn requires(&self, node: &NodeId) -> bool {
        self.required.contains(node)
    }

    /// The nodes the committed plan requires (none before commit).
    pub fn required(&self) -> impl Iterator<Item = &NodeId> {
        self.required.as_slice().iter()
    }

    /// The orchestrator withdraws the run while it plans (or is
    /// suspended): `planning_aborted` with reason `withdrawn`. A run past
    /// planning is refused (`not_planning`).
    pub fn withdraw(&mut self, at: Time, out: &mut Vec<Event>) -> Result<(), Refusal> {
        self.settle_before(at, out);
        match self.phase {
            RunPhase::Planning { .. } | RunPhase::Suspended { .. } => {
                self.abort(at, AbortReason::Withdrawn, out);
                Ok(())
            }
            ref other => Err(Refusal::NotPlanning {
                run: self.run.clone(),
                state: other.name(),
            }),
        }
    }

    fn abort(&mut self, at: Time, reason: AbortReason, out: &mut Vec<Event>) {
        self.phase = RunPhase::Ended(RunEnd::Aborted(reason));
        out.push(Event::PlanningAborted {
            at,
            pool: self.pool.clone(),
            run: self.run.clone(),
            reason,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::{Reason, Verdict};
    use crate::test_support::{node, t};

    fn guard(policy: OnReadinessLost, wait_timeout: Option<u64>) -> (RunGuard, Vec<Event>) {
        let mut out = Vec::new();
        let guard = RunGuard::begin(
            RunId::new("r").unwrap(),
            PoolId::new("p").unwrap(),
            Epoch(1),
            PlanningPolicy {
                on_readiness_lost: policy,
                wait_timeout: wait_timeout.map(Duration::from_millis),
            },
            t(0),
            &mut out,
        );
        (guard, out)
    }

    fn names(events: &[Event]) -> Vec<&'static str> {
        events.iter().map(Event::name).collect()
    }

    fn lost(reason: Reason) -> NodeChange {
        NodeChange {
            reason,
            before: Verdict::default(),
            after: Verdict::NOTHING_KNOWN,
            fingerprint: None,
        }
    }

    #[test]
    fn a_restored_run_waits_for_a_view_still_forming_but_not_for_a_node_that_says_it_is_lost() {
        let restored = || {
            RunGuard::restored(
                RunId::new("r").unwrap(),
                PoolId::new("p").unwrap(),
                Epoch(3),
                vec![(node("a"), None), (node("b"), None)],
                PlanningPolicy {
                    on_readiness_lost: OnReadinessLost::Wait,
                    wait_timeout: None,
                },
                t(5000),
            )
        };
        let mut out = Vec::new();
        // Not live yet, suspected, declared dead by a view that is still
        // forming: waited for, until the grace ends.
        for reason in [
            Reason::Dead,
            Reason::Suspect,
            Reason::NoIdentity,
            Reason::Unknown,
        ] {
            let mut g = restored();
            g.node_changed(t(10), &node("a"), &lost(reason), &mut out);
            assert!(out.is_empty(), "{reason:?}: {out:?}");
            assert_eq!(g.confirm_by(), Some(t(5000)));
        }
        // The node's own word: a fault, or the availability it gave since
        // withdrawn, faults the run at once.
        for reason in [Reason::Faulted, Reason::Unavailable] {
            let mut g = restored();
            g.node_changed(t(10), &node("b"), &lost(reason), &mut out);
            assert!(
                matches!(
                    out.as_slice(),
                    [Event::RunFaulted { at, node: n, reason: r, .. }]
                        if *at == t(10) && *n == node("b") && *r == reason
                ),
                "{reason:?}: {out:?}"
            );
            assert!(g.is_ended());
            assert_eq!(g.confirm_by(), None);
            out.clear();
        }
    }

    #[test]
    fn readiness_lost_under_abort_aborts_planning() {
        let (mut g, mut out) = guard(OnReadinessLost::Abort, None);
        g.readiness_lost(t(10), &mut out);
        assert_eq!(names(&out), ["planning_started", "planning_aborted"]);
        assert!(matches!(
            out[1],
            Event::PlanningAborted {
                reason: AbortReason::ReadinessLost,
                ..
            }
        ));
        assert!(g.is_ended());
    }

    #[test]
    fn readiness_lost_under_wait_suspends_and_the_next_pool_ready_resumes() {
        let (mut g, mut out) = guard(OnReadinessLost::Wait, Some(1000));
        g.readiness_lost(t(10), &mut out);
        assert_eq!(g.deadline(), Some(t(1010)));
        g.pool_ready(t(900), Epoch(2), &mut out);
        assert_eq!(
            names(&out),
            ["planning_started", "planning_suspended", "planning_resumed"]
        );
        assert_eq!(g.phase(), &RunPhase::Planning { epoch: Epoch(2) });
        assert_eq!(g.deadline(), None);
    }

    #[test]
    fn the_wait_timeout_aborts_a_suspended_run() {
        let (mut g, mut out) = guard(OnReadinessLost::Wait, Some(1000));
        g.readiness_lost(t(10), &mut out);
        g.on_deadline(t(1009), &mut out);
        assert!(!g.is_ended());
        g.on_deadline(t(1010), &mut out);
        assert!(matches!(
            out.last(),
            Some(Event::PlanningAborted {
                reason: AbortReason::WaitTimeout,
                at,
                ..
            }) if *at == t(1010)
        ));
    }

    #[test]
    fn pool_ready_at_the_instant_the_wait_runs_out_wins() {
        let (mut g, mut out) = guard(OnReadinessLost::Wait, Some(1000));
        g.readiness_lost(t(10), &mut out);
        g.pool_ready(t(1010), Epoch(2), &mut out);
        g.on_deadline(t(1010), &mut out);
        assert_eq!(names(&out).last(), Some(&"planning_resumed"));
        assert!(!g.is_ended());
    }

    #[test]
    fn pool_ready_after_the_wait_ran_out_comes_too_late() {
        let (mut g, mut out) = guard(OnReadinessLost::Wait, Some(1000));
        g.readiness_lost(t(10), &mut out);
        g.pool_ready(t(1011), Epoch(2), &mut out);
        assert_eq!(names(&out).last(), Some(&"planning_aborted"));
    }

    #[test]
    fn without_a_wait_timeout_a_suspended_run_waits_forever() {
        let (mut g, mut out) = guard(OnReadinessLost::Wait, None);
        g.readiness_lost(t(10), &mut out);
        assert_eq!(g.deadline(), None);
        g.on_deadline(t(u32::MAX.into()), &mut out);
        assert!(!g.is_ended());
    }

    #[test]
    fn a_suspended_run_cannot_commit() {
        let (mut g, mut out) = guard(OnReadinessLost::Wait, None);
        g.readiness_lost(t(10), &mut out);
        let err = g.commit(
            t(20),
            RequiredNodes::new(vec![node("a")]).unwrap(),
            Epoch(1),
            &mut out,
        );
        assert_eq!(err.unwrap_err().code(), "run_not_planning");
    }

    #[test]
    fn after_commit_a_required_node_lost_faults_the_run() {
        let (mut g, mut out) = guard(OnReadinessLost::Wait, None);
        g.commit(
            t(5),
            RequiredNodes::new(vec![node("b"), node("a"), node("a")]).unwrap(),
            Epoch(1),
            &mut out,
        )
        .unwrap();
        assert!(
            matches!(&out[1], Event::RunCommitted { required, .. } if required == &[node("a"), node("b")])
        );
        g.node_changed(t(9), &node("a"), &lost(Reason::Suspect), &mut out);
        assert!(matches!(
            out.last(),
            Some(Event::RunFaulted { node: n, reason: Reason::Suspect, .. }) if n == &node("a")
        ));
        assert!(g.is_ended());
    }

    #[test]
    fn after_commit_a_non_required_node_lost_does_not_fault_the_run() {
        let (mut g, mut out) = guard(OnReadinessLost::Wait, None);
        g.commit(
            t(5),
            RequiredNodes::new(vec![node("a")]).unwrap(),
            Epoch(1),
            &mut out,
        )
        .unwrap();
        g.node_changed(t(9), &node("b"), &lost(Reason::Dead), &mut out);
        g.readiness_lost(t(9), &mut out);
        assert_eq!(names(&out), ["planning_started", "run_committed"]);
    }

    #[test]
    fn a_required_identity_rotation_faults_the_run() {
        let (mut g, mut out) = guard(OnReadinessLost::Wait, None);
        g.commit(
            t(5),
            RequiredNodes::new(vec![node("a")]).unwrap(),
            Epoch(1),
            &mut out,
        )
        .unwrap();
        let rotated = NodeChange {
            reason: Reason::IdentityChanged,
            before: Verdict::default(),
            after: Verdict::default(),
            fingerprint: None,
        };
        g.node_changed(t(9), &node("a"), &rotated, &mut out);
        assert_eq!(names(&out).last(), Some(&"run_faulted"));
    }

    #[test]
    fn a_committed_run_finishes_once() {
        let (mut g, mut out) = guard(OnReadinessLost::Wait, None);
        assert!(g.finish(t(1), &mut out).is_err());
        g.commit(
            t(5),
            RequiredNodes::new(vec![node("a")]).unwrap(),
            Epoch(1),
            &mut out,
        )
        .unwrap();
        g.finish(t(6), &mut out).unwrap();
        assert_eq!(names(&out).last(), Some(&"run_finished"));
        assert!(g.finish(t(7), &mut out).is_err());
    }
}
