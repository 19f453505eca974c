//! The pool's gate: its readiness, and every decision about runs that the
//! pool makes (design §2–§3): planning admission, the wait/abort policy until
//! a plan is committed, and handing the committed run over to its guard.
//!
//! [`PoolMachine`] composes [`PoolReadiness`] with the planning run's
//! [`RunGuard`]. Once a plan is committed the guard leaves the pool
//! ([`PoolMachine::commit`] returns it): faults are the run's own business
//! from then on. The pool keeps the run's id and required nodes so it can
//! refuse what a committed run forbids and tell which changes concern it;
//! it hears that the run ended through [`PoolMachine::run_ended`].
//!
//! Calling contract: inputs stamped `T` are applied before timers due at
//! `T`. Every input first fires the deadlines (convergence, wait) due
//! strictly before it, in time order; [`PoolMachine::on_deadline`] fires those
//! at or before its instant. When `PoolReady` and a wait timeout fall due
//! at the same instant, `PoolReady` wins (design §3).

use std::time::Duration;

use crate::event::Event;
use crate::ids::PoolId;
use crate::ids::{Epoch, NodeId, RunId};
use crate::node::{NodeChange, Verdict};
use crate::pool::{
    CandidateSummary, LastChange, NodeDetail, PoolDefinition, PoolPhase, PoolReadiness,
    Redefinition, SlotKey,
};
use crate::run::{PlanningPolicy, Refusal, RequiredNodes, RunGuard};
use crate::time::Time;

/// The run the pool has, if any.
#[derive(Debug)]
enum ActiveRun {
    /// No run: the next `begin_planning` may start one.
    None,
    /// Planning or suspended; the pool holds its guard. Left by commit
    /// (to `Committed`) or by an abort (to `None`).
    Planning(RunGuard),
    /// Committed: its guard lives with the run's actor; the pool keeps
    /// the run as stored (its epoch, its required set sorted, their
    /// fingerprints), the one record of it here. Left when the run ends
    /// (faulted or finished).
    Committed {
        stored: DurableRun,
        /// A restored run's confirmation deadline (design §9).
        confirm_by: Option<Time>,
    },
}

/// What a gate keeps across restarts (design §9): the last epoch it issued
/// and its active run. Serde, so a `StateStore` (poolgate-actors)
/// of one's own (a database, etcd) can keep it as it is.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Durable {
    /// The last epoch issued; the next is higher.
    pub last_epoch: u64,
    /// The active run, if any.
    pub run: Option<DurableRun>,
}

/// The active run as stored.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DurableRun {
    /// The run.
    pub run: RunId,
    /// The epoch it was bound to.
    pub epoch: Epoch,
    /// Committed (provisioning began), or still planning.
    pub committed: bool,
    /// The required nodes with their identity fingerprints at commit.
    pub required: Vec<(NodeId, Option<crate::identity::Fingerprint>)>,
}

/// A commit [`PoolMachine::admit_commit`] admitted: what
/// [`PoolMachine::commit_admitted`] commits and [`PoolMachine::durable_with`]
/// stores, computed once. Not `Clone`: one admission, one commit.
#[derive(Debug, PartialEq, Eq)]
pub struct AdmittedCommit {
    /// The required nodes as the plan gave them (for a recording).
    asked_required: Vec<NodeId>,
    /// The same, sorted and each once.
    required: RequiredNodes,
    /// The epoch the caller gave, if any.
    asked: Option<Epoch>,
    /// The run as it will be stored: its epoch, its required set sorted,
    /// each with the fingerprint it is committed with.
    stored: DurableRun,
}

impl AdmittedCommit {
    /// The run.
    pub fn run(&self) -> &RunId {
        &self.stored.run
    }

    /// The epoch it commits on.
    pub fn epoch(&self) -> Epoch {
        self.stored.epoch
    }

    /// The nodes it requires, sorted, each once.
    pub fn required(&self) -> &RequiredNodes {
        &self.required
    }

    /// The command as it was asked (for a recording).
    pub fn command(&self) -> crate::input::Command {
        crate::input::Command::CommitPlan {
            run: self.stored.run.clone(),
            required: self.asked_required.clone(),
            epoch: self.asked,
        }
    }
}

/// Where the pool stands, and why (design §6's readiness report).
#[derive(Clone, Debug)]
pub struct PoolReport {
    /// The pool's id.
    pub pool: PoolId,
    /// Forming, converging (with deadline) or ready (with epoch).
    pub phase: PoolPhase,
    /// Every candidate, sorted by id: ready or what blocks it, and since
    /// when.
    pub candidates: Vec<CandidateSummary>,
    /// The last view change (the start of the current window).
    pub last_change: LastChange,
    /// The active run, planning or committed, if any.
    pub run: Option<RunId>,
    /// SWIM observations ignored as older than the view.
    pub ignored_stale: u64,
    /// Observations ignored because their node is not a candidate.
    pub ignored_non_candidate: u64,
}

/// The readiness of one candidate pool and the runs planned on it.
#[derive(Debug)]
pub struct PoolMachine {
    readiness: PoolReadiness,
    policy: PlanningPolicy,
    run: ActiveRun,
    confirm_due: Option<(RunId, Time)>,
    /// What of the durable state was last handed out to be stored (see
    /// [`PoolMachine::take_durable_change`]).
    handed_out: DurableMark,
}

/// What tells one durable state from another, without copying it: the
/// last epoch, and the active run's id, epoch and whether it is
/// committed (a committed run's required set is fixed at its commit).
type DurableMark = (u64, Option<(RunId, Epoch, bool)>);

fn mark_of(durable: &Durable) -> DurableMark {
    (
        durable.last_epoch,
        durable
            .run
            .as_ref()
            .map(|r| (r.run.clone(), r.epoch, r.committed)),
    )
}

impl PoolMachine {
    /// A pool of `definition`'s candidates, none with any fact yet, and no
    /// run. Returns the slots to start node actors for.
    pub fn new(
        definition: &PoolDefinition,
        window: Duration,
        policy: PlanningPolicy,
        now: Time,
    ) -> (Self, Vec<(NodeId, SlotKey)>) {
        let (readiness, added) = PoolReadiness::new(definition, window, now);
        let gate = PoolMachine {
            readiness,
            policy,
            run: ActiveRun::None,
            confirm_due: None,
            handed_out: (0, None),
        };
        (gate, added)
    }

    /// The pool's readiness, for reports.
    pub fn readiness(&self) -> &PoolReadiness {
        &self.readiness
    }

    /// The report of where the pool stands; the counts of ignored
    /// observations are kept by whoever routes them.
    pub fn report(&self, ignored_stale: u64, ignored_non_candidate: u64) -> PoolReport {
        PoolReport {
            pool: self.readiness.id().clone(),
            phase: self.readiness.phase(),
            candidates: self.readiness.candidates(),
            last_change: self.readiness.last_change().clone(),
            run: self.active_run().cloned(),
            ignored_stale,
            ignored_non_candidate,
        }
    }

    /// The active run, planning or committed.
    pub fn active_run(&self) -> Option<&RunId> {
        match &self.run {
            ActiveRun::None => None,
            ActiveRun::Planning(guard) => Some(guard.run()),
            ActiveRun::Committed { stored, .. } => Some(&stored.run),
        }
    }

    /// The committed run, if one is, and the first of its required nodes
    /// (sorted): what a fault of the run as a whole names.
    pub fn committed_run(&self) -> Option<(&RunId, &NodeId)> {
        match &self.run {
            ActiveRun::Committed { stored, .. } => {
                stored.required.first().map(|(node, _)| (&stored.run, node))
            }
            _ => None,
        }
    }

    /// The committed run, if `node` is one of its required nodes: its
    /// changes go to that run's guard.
    pub fn committed_run_requiring(&self, node: &NodeId) -> Option<&RunId> {
        match &self.run {
            ActiveRun::Committed { stored, .. } => stored
                .required
                .binary_search_by(|(n, _)| n.cmp(node))
                .ok()
                .map(|_| &stored.run),
            _ => None,
        }
    }

    /// When the next timer is due (the convergence window, the planning
    /// run's wait, a restored run's confirmation), if any.
    pub fn deadline(&self) -> Option<Time> {
        let wait = match &self.run {
            ActiveRun::Planning(guard) => guard.deadline(),
            ActiveRun::Committed { confirm_by, .. } => *confirm_by,
            ActiveRun::None => None,
        };
        match (self.readiness.deadline(), wait) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// A timer armed for `now` fired: fires what is due at or before it. A
    /// timer that finds nothing due is a no-op.
    pub fn on_deadline(&mut self, now: Time, out: &mut Vec<Event>) {
        self.fire_due(|due| due <= now, out);
    }

    /// Fires what fell due strictly before `at`, the instant of an input,
    /// and returns the instant the input is applied at (never earlier than
    /// anything seen).
    pub fn settle_before(&mut self, at: Time, out: &mut Vec<Event>) -> Time {
        self.fire_due(|due| due < at, out);
        self.readiness.settle_before(at, out)
    }

    /// Records what a report shows of a candidate besides its verdict.
    pub fn set_detail(&mut self, key: SlotKey, detail: NodeDetail) {
        self.readiness.set_detail(key, detail);
    }

    /// A candidate's node actor reports a change of its view; returns the
    /// verdict it replaced (`None` for a slot of an earlier definition).
    pub fn node_changed(
        &mut self,
        key: SlotKey,
        at: Time,
        change: &NodeChange,
        out: &mut Vec<Event>,
    ) -> Option<Verdict> {
        let at = self.settle_before(at, out);
        let start = out.len();
        let before = self.readiness.node_changed(key, at, change, out);
        self.planning_hears(start, out);
        before
    }

    /// Replaces the candidate set (design §2); refused while a run is
    /// committed.
    pub fn define(
        &mut self,
        definition: &PoolDefinition,
        at: Time,
        out: &mut Vec<Event>,
    ) -> Result<Redefinition, Refusal> {
        let at = self.settle_before(at, out);
        if let ActiveRun::Committed { stored, .. } = &self.run {
            return Err(Refusal::RunCommitted(stored.run.clone()));
        }
        let start = out.len();
        let change = self.readiness.redefine(definition, at, out);
        self.planning_hears(start, out);
        if let ActiveRun::Planning(guard) = &mut self.run {
            guard.moved_to(definition.id().clone());
        }
        Ok(change)
    }

    /// Forgets every candidate's summary, as after a restart of the pool's
    /// actor: readiness starts over, the epoch keeps rising.
    pub fn restart(&mut self, at: Time, out: &mut Vec<Event>) {
        let at = self.settle_before(at, out);
        let start = out.len();
        self.readiness.restart(at, out);
        self.planning_hears(start, out);
    }

    /// Begins planning `run` (design §3): only while Ready, on the current
    /// epoch if one is given, one run at a time. Returns the epoch the run
    /// is bound to.
    pub fn begin(
        &mut self,
        run: RunId,
        epoch: Option<Epoch>,
        at: Time,
        out: &mut Vec<Event>,
    ) -> Result<Epoch, Refusal> {
        let at = self.settle_before(at, out);
        let current = self.current_epoch(epoch)?;
        if let Some(active) = self.active_run() {
            return Err(Refusal::RunInProgress(active.clone()));
        }
        self.run = ActiveRun::Planning(RunGuard::begin(
            run,
            self.readiness.id().clone(),
            current,
            self.policy,
            at,
            out,
        ));
        Ok(current)
    }

    /// Commits the planning run's plan (design §3): provisioning begins, and
    /// the run's guard is handed over for the run's actor to keep.
    ///
    /// Checked in this order: a plan that requires no node
    /// (`invalid_plan`), a run that is not the active one (`unknown_run`),
    /// a pool that is not ready or an epoch that is not the current one, a
    /// required node that is not a candidate, a run that is not planning.
    pub fn commit(
        &mut self,
        run: &RunId,
        required: Vec<NodeId>,
        epoch: Option<Epoch>,
        at: Time,
        out: &mut Vec<Event>,
    ) -> Result<RunGuard, Refusal> {
        let admitted = self.admit_commit(run, required, epoch, at, out)?;
        self.commit_admitted(admitted, at, out)
    }

    /// Whether [`PoolMachine::commit`] would accept this plan now (settling
    /// first, checked in its order), and if so what it would commit and
    /// store. Nothing changes: a caller that must make the commit durable
    /// first admits, stores [`PoolMachine::durable_with`], then commits
    /// with [`PoolMachine::commit_admitted`], giving the pool nothing else
    /// in between.
    pub fn admit_commit(
        &mut self,
        run: &RunId,
        required: Vec<NodeId>,
        epoch: Option<Epoch>,
        at: Time,
        out: &mut Vec<Event>,
    ) -> Result<AdmittedCommit, Refusal> {
        self.settle_before(at, out);
        let Some(nodes) = RequiredNodes::new(required.clone()) else {
            return Err(Refusal::InvalidPlan(run.clone()));
        };
        if self.active_run() != Some(run) {
            return Err(Refusal::UnknownRun(run.clone()));
        }
        let current = self.current_epoch(epoch)?;
        if let Some(node) = nodes
            .as_slice()
            .iter()
            .find(|n| !self.readiness.is_candidate(n))
        {
            return Err(Refusal::NotCandidate(node.clone()));
        }
        match &self.run {
            ActiveRun::Planning(guard) => match guard.phase() {
                crate::run::RunPhase::Planning { .. } => {}
                other => {
                    return Err(Refusal::NotPlanning {
                        run: run.clone(),
                        state: other.name(),
                    })
                }
            },
            _ => {
                return Err(Refusal::NotPlanning {
                    run: run.clone(),
                    state: "committed",
                })
            }
        }
        let candidates = self.readiness.candidates();
        let stored = DurableRun {
            run: run.clone(),
            epoch: current,
            committed: true,
            required: nodes
                .as_slice()
                .iter()
                .map(|n| {
                    let fingerprint = candidates
                        .iter()
                        .find(|c| &c.node == n)
                        .and_then(|c| c.fingerprint);
                    (n.clone(), fingerprint)
                })
                .collect(),
        };
        Ok(AdmittedCommit {
            asked_required: required,
            required: nodes,
            asked: epoch,
            stored,
        })
    }

    /// What to store for `admitted` before it is committed (design §9: a
    /// commit is durable before `run_committed` is told); handed out, as
    /// [`PoolMachine::take_durable_change`] hands out.
    pub fn durable_with(&mut self, admitted: &AdmittedCommit) -> Durable {
        let durable = Durable {
            last_epoch: self.readiness.last_epoch(),
            run: Some(admitted.stored.clone()),
        };
        self.handed_out = mark_of(&durable);
        durable
    }

    /// The durable state, if it changed since it was last handed out: to
    /// be stored before the events produced meanwhile are told (design §9:
    /// an epoch is never told before it is stored; a planning run's start,
    /// abort and resumption, a commit and a run's end are stored too).
    /// The pool's shell stores what this gives, as raft-rs's `Ready`
    /// carries what to persist; it never guesses from the events.
    pub fn take_durable_change(&mut self) -> Option<Durable> {
        // Told apart by their marks first: a committed run's required set
        // is not copied on every input.
        let run = match &self.run {
            ActiveRun::None => None,
            ActiveRun::Planning(guard) => Some((guard.run(), self.planning_epoch(guard), false)),
            ActiveRun::Committed { stored, .. } => Some((&stored.run, stored.epoch, true)),
        };
        let (last, held) = &self.handed_out;
        let same = *last == self.readiness.last_epoch()
            && match (run, held) {
                (None, None) => true,
                (Some((run, epoch, committed)), Some((r, e, c))) => {
                    run == r && epoch == *e && committed == *c
                }
                _ => false,
            };
        if same {
            return None;
        }
        let now = self.durable();
        self.handed_out = mark_of(&now);
        Some(now)
    }

    /// The epoch a planning run is stored with.
    fn planning_epoch(&self, guard: &RunGuard) -> Epoch {
        match guard.phase() {
            crate::run::RunPhase::Planning { epoch } => *epoch,
            _ => Epoch(self.readiness.last_epoch()),
        }
    }

    /// Commits what [`PoolMachine::admit_commit`] admitted, at the same `at`
    /// with nothing applied in between.
    pub fn commit_admitted(
        &mut self,
        admitted: AdmittedCommit,
        at: Time,
        out: &mut Vec<Event>,
    ) -> Result<RunGuard, Refusal> {
        let AdmittedCommit {
            required, stored, ..
        } = admitted;
        // Admitted by this gate for its run on its current epoch, or not
        // at all (an admission kept past its moment, or another gate's).
        let current = self.readiness.ready_epoch();
        let ActiveRun::Planning(guard) = &mut self.run else {
            return Err(Refusal::NotPlanning {
                run: stored.run,
                state: "committed",
            });
        };
        if guard.run() != &stored.run {
            return Err(Refusal::UnknownRun(stored.run));
        }
        if current != Some(stored.epoch) {
            return Err(Refusal::StaleEpoch {
                given: stored.epoch,
                current,
            });
        }
        guard.commit(at, required, stored.epoch, out)?;
        let ActiveRun::Planning(guard) = std::mem::replace(&mut self.run, ActiveRun::None) else {
            unreachable!("the run was planning a line above");
        };
        self.run = ActiveRun::Committed {
            stored,
            confirm_by: None,
        };
        Ok(guard)
    }

    /// Whether `run` may be finished by its guard: it must be the active
    /// run, and committed.
    pub fn may_finish(
        &mut self,
        run: &RunId,
        at: Time,
        out: &mut Vec<Event>,
    ) -> Result<(), Refusal> {
        self.settle_before(at, out);
        match &self.run {
            ActiveRun::Committed { stored, .. } if &stored.run == run => Ok(()),
            ActiveRun::Planning(guard) if guard.run() == run => Err(Refusal::NotCommitted {
                run: run.clone(),
                state: guard.phase().name(),
            }),
            _ => Err(Refusal::UnknownRun(run.clone())),
        }
    }

    /// Withdraws `run` while it plans or is suspended (design §3: its
    /// requester is gone): `planning_aborted` with reason `withdrawn`, and
    /// the pool is free for the next run. A committed run is refused
    /// (`not_planning`: it is finished, not withdrawn), any other run
    /// `unknown_run`.
    pub fn abort_planning(
        &mut self,
        run: &RunId,
        at: Time,
        out: &mut Vec<Event>,
    ) -> Result<(), Refusal> {
        let at = self.settle_before(at, out);
        match &mut self.run {
            ActiveRun::Planning(guard) if guard.run() == run => {
                guard.withdraw(at, out)?;
                self.run = ActiveRun::None;
                Ok(())
            }
            ActiveRun::Committed { stored, .. } if &stored.run == run => {
                Err(Refusal::NotPlanning {
                    run: run.clone(),
                    state: "committed",
                })
            }
            _ => Err(Refusal::UnknownRun(run.clone())),
        }
    }

    /// The committed run `run` ended (faulted or finished): the pool is
    /// free for the next run.
    pub fn run_ended(&mut self, run: &RunId) {
        if matches!(&self.run, ActiveRun::Committed { stored, .. } if &stored.run == run) {
            self.run = ActiveRun::None;
        }
    }

    fn current_epoch(&self, given: Option<Epoch>) -> Result<Epoch, Refusal> {
        let current = self.readiness.ready_epoch().ok_or(Refusal::PoolNotReady)?;
        match given {
            Some(given) if given != current => Err(Refusal::StaleEpoch {
                given,
                current: Some(current),
            }),
            _ => Ok(current),
        }
    }

    /// Fires, in time order, every deadline `due` accepts; `PoolReady`
    /// first when both fall due at one instant.
    fn fire_due(&mut self, due: impl Fn(Time) -> bool, out: &mut Vec<Event>) {
        loop {
            let convergence = self.readiness.deadline().filter(|t| due(*t));
            let wait = match &self.run {
                ActiveRun::Planning(guard) => guard.deadline().filter(|t| due(*t)),
                ActiveRun::Committed { confirm_by, .. } => confirm_by.filter(|t| due(*t)),
                ActiveRun::None => None,
            };
            let next = match (convergence, wait) {
                (None, None) => return,
                (Some(ready), Some(timeout)) if timeout < ready => Err(timeout),
                (Some(ready), _) => Ok(ready),
                (None, Some(timeout)) => Err(timeout),
            };
            match next {
                Ok(ready) => {
                    let start = out.len();
                    self.readiness.on_deadline(ready, out);
                    self.planning_hears(start, out);
                }
                Err(timeout) => match &mut self.run {
                    ActiveRun::Planning(guard) => {
                        guard.on_deadline(timeout, out);
                        self.drop_ended_run();
                    }
                    ActiveRun::Committed { stored, confirm_by } => {
                        // The run's guard decides; its actor is told.
                        *confirm_by = None;
                        self.confirm_due = Some((stored.run.clone(), timeout));
                    }
                    ActiveRun::None => {}
                },
            }
        }
    }

    /// A restored run's confirmation deadline that fell due, for the run's
    /// guard to decide on (taken once).
    pub fn take_confirm_due(&mut self) -> Option<(RunId, Time)> {
        self.confirm_due.take()
    }

    /// Restores what a gate kept before a restart (design §9): epochs
    /// continue above the last one issued; a planning run is aborted
    /// (`restarted`); a committed run is guarded again, its required nodes
    /// to be confirmed within `grace`: its guard is returned for the run's
    /// actor.
    pub fn restore(
        &mut self,
        durable: &Durable,
        grace: Duration,
        at: Time,
        out: &mut Vec<Event>,
    ) -> Option<RunGuard> {
        self.readiness.resume_epochs_after(durable.last_epoch);
        // The store holds it: only what changes from it is stored again.
        self.handed_out = mark_of(durable);
        let stored = durable.run.as_ref()?;
        if !stored.committed {
            out.push(Event::PlanningAborted {
                at,
                pool: self.readiness.id().clone(),
                run: stored.run.clone(),
                reason: crate::event::AbortReason::Restarted,
            });
            return None;
        }
        let confirm_by = at + grace;
        // Kept as stored (its required set in order, as a commit keeps
        // it): the next durable write (an epoch) must keep it.
        let mut kept = stored.clone();
        RequiredNodes::in_order(&mut kept.required, |(node, _)| node);
        let guard = RunGuard::restored(
            kept.run.clone(),
            self.readiness.id().clone(),
            kept.epoch,
            kept.required.clone(),
            self.policy,
            confirm_by,
        );
        self.run = ActiveRun::Committed {
            stored: kept,
            confirm_by: Some(confirm_by),
        };
        Some(guard)
    }

    /// What to store of the active run now.
    pub fn durable(&self) -> Durable {
        let run = match &self.run {
            ActiveRun::None => None,
            ActiveRun::Planning(guard) => Some(DurableRun {
                run: guard.run().clone(),
                epoch: self.planning_epoch(guard),
                committed: false,
                required: Vec::new(),
            }),
            ActiveRun::Committed { stored, .. } => Some(stored.clone()),
        };
        Durable {
            last_epoch: self.readiness.last_epoch(),
            run,
        }
    }

    /// The planning run hears what the pool's readiness did (the events
    /// from `start` on): suspended, aborted or resumed by its policy.
    fn planning_hears(&mut self, start: usize, out: &mut Vec<Event>) {
        let ActiveRun::Planning(guard) = &mut self.run else {
            return;
        };
        let mut heard = Vec::new();
        for event in &out[start..] {
            match event {
                Event::PoolReady { at, epoch, .. } => guard.pool_ready(*at, *epoch, &mut heard),
                Event::ReadinessLost { at, .. } => guard.readiness_lost(*at, &mut heard),
                _ => {}
            }
        }
        out.append(&mut heard);
        self.drop_ended_run();
    }

    fn drop_ended_run(&mut self) {
        if matches!(&self.run, ActiveRun::Planning(guard) if guard.is_ended()) {
            self.run = ActiveRun::None;
        }
    }
}

#[cfg(test)]
mod tests;
