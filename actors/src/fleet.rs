//! Many pools over one fleet (design §14): one table of node facts, any
//! number of pools, and a node reserved by one committed run at a time.
//!
//! Each pool is a [`Gate`] of its own (its window, policy, epochs, run and
//! store), on the fleet's one clock. Facts are about nodes: one
//! observation reaches every pool that holds the node as a candidate,
//! applied once per pool and no more, and the fleet keeps each node's
//! facts so that a pool defined later starts from what is known.
//! Commands are about pools: a commit that would take a node another
//! pool's committed run holds is refused `reserved` (all or nothing);
//! the run's end releases its nodes.
//!
//! ```
//! use std::time::Duration;
//! use poolgate_actors::core::{
//!     AgentReport, MembershipUpdate, NodeId, OnReadinessLost, PlanningPolicy, PoolDefinition,
//!     PoolId, RegistryFact, RunId, SwimState,
//! };
//! use poolgate_actors::{Fleet, GateError, GateSettings};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let n = |s: &str| NodeId::new(s).unwrap();
//! let policy = PlanningPolicy { on_readiness_lost: OnReadinessLost::Wait, wait_timeout: None };
//! let pool = |id: &str, members: &[&str]| {
//!     let definition = PoolDefinition::new(PoolId::new(id)?, members.iter().map(|m| n(m)).collect())?;
//!     GateSettings::new(definition, Duration::from_millis(20), policy)
//! };
//! actix::System::new().block_on(async move {
//!     let fleet = Fleet::try_start(vec![pool("a", &["n1", "n2"])?, pool("b", &["n2", "n3"])?])?;
//!     for node in ["n1", "n2", "n3"] {
//!         fleet.registry(RegistryFact::Known { node: n(node) }).await?;
//!         fleet.membership(MembershipUpdate { node: n(node), state: SwimState::Alive, incarnation: 1 }).await?;
//!         fleet.agent(AgentReport::Available { node: n(node) }).await?;
//!         fleet.agent(AgentReport::identity(n(node), node.as_bytes().to_vec())?).await?;
//!     }
//!     let (a, b) = (fleet.pool(&PoolId::new("a")?).unwrap(), fleet.pool(&PoolId::new("b")?).unwrap());
//!     let ready = a.wait_ready().await?;
//!     a.begin_planning(RunId::new("r1")?, Some(ready.epoch)).await?;
//!     a.commit_plan(RunId::new("r1")?, vec![n("n2")], Some(ready.epoch)).await?;
//!     // n2 serves a's run: b cannot commit a run on it.
//!     let ready = b.wait_ready().await?;
//!     b.begin_planning(RunId::new("r2")?, Some(ready.epoch)).await?;
//!     let refused = b.commit_plan(RunId::new("r2")?, vec![n("n2"), n("n3")], Some(ready.epoch)).await;
//!     assert!(matches!(&refused, Err(e) if e.code() == "reserved"), "{refused:?}");
//!     Ok::<(), Box<dyn std::error::Error>>(())
//! })
//! # }
//! ```

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use poolgate_core::{
    AgentReport, Candidacy, Command, Input, MembershipUpdate, NodeFacts, NodeId, Observation,
    PoolId, PoolReport, Refusal, RegistryFact, RunId, Time,
};

use crate::clock::Clock;
use crate::error::GateError;
use crate::gate::{Accepted, Gate};
use crate::messages::{Fanout, ObservationOutcome};
use crate::publisher::{EventStream, Publisher};
use crate::recording::Recording;
use crate::reservations::Reservations;
use crate::settings::GateSettings;

/// How many times a new pool is told its members' facts again while they
/// keep changing under it (a fact that came in meanwhile also went to it).
const TELL_AGAIN: usize = 8;

/// The handle of a running fleet. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Fleet {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    clock: Clock,
    /// Every pool's events, in the order each pool published them.
    stream: Publisher,
    reservations: Reservations,
    state: Mutex<State>,
    /// The window and policy of a pool defined by `define_pool` alone.
    template: (std::time::Duration, poolgate_core::PlanningPolicy),
    /// Where every pool records (`--record`), one file for all.
    recording: Option<Recording>,
    /// Whether a pool defined is told what the fleet holds of its members
    /// (not when replaying a recording: its records hold what was told).
    tells: bool,
}

#[derive(Debug, Default)]
struct State {
    gates: BTreeMap<PoolId, Gate>,
    candidacy: Candidacy,
    /// The facts of every node that is known to the registry or a
    /// candidate of some pool: what a pool defined later starts from.
    /// Boxed: a fleet-wide table's spare slots then cost a pointer each,
    /// not a node's facts.
    facts: HashMap<NodeId, Box<NodeFacts>>,
    /// The number the next observation handed to the pools takes (a
    /// fleet's recording writes each once).
    next_fanout: u64,
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.stream.close();
        if let Some(recording) = &self.recording {
            recording.close_all();
        }
    }
}

impl Fleet {
    /// Starts a fleet with `pools` (none is allowed: pools may be defined
    /// later) on the current actix `System`. A pool defined later by
    /// [`Fleet::define_pool`] alone takes the first pool's window and
    /// policy (with no pool at start: a 5 s window, `wait` forever).
    pub fn try_start(pools: Vec<GateSettings>) -> Result<Fleet, GateError> {
        Fleet::start_with(pools, None, true)
    }

    /// A fleet with no pool, to replay a fleet's recording into: a pool
    /// it defines is told nothing of its members (the recording holds
    /// what the live fleet told it, when it was applied).
    pub fn try_start_replaying() -> Result<Fleet, GateError> {
        Fleet::start_with(Vec::new(), None, false)
    }

    /// As [`Fleet::try_start`], recording every pool's inputs into
    /// `recording` (`--record`, one file: design §14): each pool's
    /// settings and definition when it starts, each observation once,
    /// each command naming its pool. `poolgate replay` of it prints the
    /// events every pool published. A recording in a pool's own settings
    /// is not used: this one is.
    pub fn try_start_recording(
        pools: Vec<GateSettings>,
        recording: Recording,
    ) -> Result<Fleet, GateError> {
        Fleet::start_with(pools, Some(recording), true)
    }

    fn start_with(
        pools: Vec<GateSettings>,
        recording: Option<Recording>,
        tells: bool,
    ) -> Result<Fleet, GateError> {
        for settings in &pools {
            settings.check().map_err(GateError::InvalidSettings)?;
        }
        if actix::System::try_current().is_none() || tokio::runtime::Handle::try_current().is_err()
        {
            return Err(GateError::NoSystem);
        }
        let mut ids = std::collections::BTreeSet::new();
        for settings in &pools {
            if !ids.insert(settings.definition.id().clone()) {
                return Err(GateError::InvalidSettings(format!(
                    "pool {} is defined twice",
                    settings.definition.id()
                )));
            }
        }
        let template = pools.first().map_or(
            (
                std::time::Duration::from_secs(5),
                poolgate_core::PlanningPolicy {
                    on_readiness_lost: poolgate_core::OnReadinessLost::Wait,
                    wait_timeout: None,
                },
            ),
            |first| (first.window, first.policy),
        );
        let fleet = Fleet {
            shared: Arc::new(Shared {
                clock: Clock::start(),
                stream: Publisher::default(),
                reservations: Reservations::default(),
                state: Mutex::default(),
                template,
                recording,
                tells,
            }),
        };
        for settings in pools {
            fleet.start_pool(settings, None);
        }
        Ok(fleet)
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.shared
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts a pool (at `started`, a replay's recorded instant, or now).
    fn start_pool(&self, mut settings: GateSettings, started: Option<Time>) -> Gate {
        let id = settings.definition.id().clone();
        let members = settings.definition.members().to_vec();
        if let Some(recording) = &self.shared.recording {
            settings.record = Some(recording.for_pool(id.clone()));
        }
        let gate = Gate::launch(
            settings,
            self.shared.clock,
            Some((&self.shared.stream, &self.shared.reservations)),
            started,
        );
        let mut state = self.state();
        state.candidacy.define(&id, &members);
        state.gates.insert(id, gate.clone());
        gate
    }

    /// The fleet's timeline (time since it started), shared by its pools.
    pub fn clock(&self) -> Clock {
        self.shared.clock
    }

    /// Every pool's events from now on, in one stream (each names its
    /// pool); the first subscription also gets the events of the pools'
    /// start.
    pub fn subscribe(&self) -> EventStream {
        self.shared.stream.subscribe()
    }

    /// The pools, by id.
    pub fn pools(&self) -> Vec<PoolId> {
        self.state().gates.keys().cloned().collect()
    }

    /// The handle of one pool, with the face of [`Gate`]: its commits take
    /// the fleet's reservations. Feed facts through the fleet, which
    /// brings each to every pool that has the node.
    pub fn pool(&self, pool: &PoolId) -> Option<Gate> {
        self.state().gates.get(pool).cloned()
    }

    /// Defines a pool: a new one (with `settings`' window, policy, store),
    /// told the facts the fleet holds of its members; or, for an id the
    /// fleet has, its new members (refused while its run is committed),
    /// each new member told what the fleet holds of it.
    pub async fn define_pool(&self, settings: GateSettings) -> Result<Gate, GateError> {
        let at = self.shared.clock.now();
        self.define_at(at, settings).await
    }

    /// As [`Fleet::define_pool`], at `at` (a replay's recorded instant).
    pub async fn define_pool_at(
        &self,
        at: Time,
        settings: GateSettings,
    ) -> Result<Gate, GateError> {
        self.define_at(at, settings).await
    }

    async fn define_at(&self, at: Time, settings: GateSettings) -> Result<Gate, GateError> {
        crate::gate::stamp_not_ahead(self.shared.clock, at)?;
        settings.check().map_err(GateError::InvalidSettings)?;
        let id = settings.definition.id().clone();
        let existing = self.pool(&id);
        let (gate, added) = match existing {
            Some(gate) => {
                let definition = settings.definition.clone();
                gate.submit(at, Input::Command(Command::DefinePool(definition)))
                    .await?;
                let added = self
                    .state()
                    .candidacy
                    .define(&id, settings.definition.members());
                (gate, added)
            }
            None => {
                let members = settings.definition.members().to_vec();
                (self.start_pool(settings, Some(at)), members)
            }
        };
        // What the fleet knows of the new members, told to the pool; told
        // again while a fact of theirs came in meanwhile (it went to the
        // pool too, and may have landed before this older word): the
        // pool ends on the latest facts whatever the order.
        let snapshot = |state: &State| -> Vec<(NodeId, NodeFacts)> {
            added
                .iter()
                .filter_map(|node| Some((node.clone(), NodeFacts::clone(state.facts.get(node)?))))
                .collect()
        };
        if !self.shared.tells {
            return Ok(gate);
        }
        let mut told = snapshot(&self.state());
        for _ in 0..TELL_AGAIN {
            for (node, facts) in &told {
                for observation in facts.as_statement() {
                    gate.route(at, Fanout::Own, node.clone(), observation)
                        .await?;
                }
            }
            let now = snapshot(&self.state());
            if now == told {
                break;
            }
            told = now;
        }
        Ok(gate)
    }

    /// Removes a pool (refused `run_committed` while its run is
    /// committed): its actors stop, its own subscriptions end; the
    /// fleet's stream goes on.
    pub async fn remove_pool(&self, pool: &PoolId) -> Result<(), GateError> {
        let gate = self
            .pool(pool)
            .ok_or_else(|| GateError::UnknownPool(pool.clone()))?;
        if let Some(run) = self.committed_run(pool) {
            return Err(GateError::Refused(Refusal::RunCommitted(run)));
        }
        gate.stop();
        if let Some(recording) = &self.shared.recording {
            recording.pool_removed(self.shared.clock.now(), pool);
        }
        let mut state = self.state();
        state.gates.remove(pool);
        state.candidacy.remove(pool);
        let State {
            candidacy, facts, ..
        } = &mut *state;
        facts.retain(|node, facts| candidacy.pools_of(node).next().is_some() || facts.is_known());
        Ok(())
    }

    /// The committed run of `pool`, if one holds its nodes.
    pub fn committed_run(&self, pool: &PoolId) -> Option<RunId> {
        let reservations = self.shared.reservations.lock();
        let state = self.state();
        state
            .candidacy
            .members(pool)?
            .iter()
            .find_map(|node| reservations.holder(node).filter(|(p, _)| p == pool))
            .map(|(_, run)| run.clone())
    }

    /// Which pool's committed run holds `node`, if any.
    pub fn reserved_by(&self, node: &NodeId) -> Option<(PoolId, RunId)> {
        self.shared.reservations.lock().holder(node).cloned()
    }

    /// Feeds a SWIM membership fact to every pool that has the node.
    pub async fn membership(&self, update: MembershipUpdate) -> Result<usize, GateError> {
        let (node, observation) = update.into_observation();
        self.observe(self.shared.clock.now(), node, observation)
            .await
    }

    /// Feeds a node agent's report to every pool that has the node.
    pub async fn agent(&self, report: AgentReport) -> Result<usize, GateError> {
        let (node, observation) = report.into_observation();
        self.observe(self.shared.clock.now(), node, observation)
            .await
    }

    /// Feeds a registry fact to every pool that has the node.
    pub async fn registry(&self, fact: RegistryFact) -> Result<usize, GateError> {
        let (node, observation) = fact.into_observation();
        self.observe(self.shared.clock.now(), node, observation)
            .await
    }

    /// Applies one observation of `node` at `at` in every pool that has it
    /// as a candidate, once each; returns how many pools that is.
    pub async fn observe(
        &self,
        at: Time,
        node: NodeId,
        observation: Observation,
    ) -> Result<usize, GateError> {
        crate::gate::stamp_not_ahead(self.shared.clock, at)?;
        let (gates, fanout) = self.note(at, &node, std::slice::from_ref(&observation));
        let mut failed = None;
        for gate in &gates {
            let answer = gate
                .route(at, fanout, node.clone(), observation.clone())
                .await;
            Self::each(&mut failed, gate, answer);
        }
        failed.map_or(Ok(gates.len()), Err)
    }

    /// Keeps the first error of one pool's answer (its refusal reaches the
    /// caller once every pool had the fact); a pool stopped since (removed)
    /// is no error.
    fn each<T>(failed: &mut Option<GateError>, gate: &Gate, answer: Result<T, GateError>) {
        match answer {
            Ok(_) => {}
            Err(GateError::Stopped) if gate.is_stopped() => {}
            Err(e) => {
                failed.get_or_insert(e);
            }
        }
    }

    /// Applies several observations of one node, in order and at one
    /// instant, in every pool that has it (one trip to each pool's actor
    /// of the node: what one agent frame says); returns how many pools.
    pub async fn observe_all(
        &self,
        node: NodeId,
        observations: Vec<Observation>,
    ) -> Result<usize, GateError> {
        let at = self.shared.clock.now();
        let (gates, fanout) = self.note(at, &node, &observations);
        let mut failed = None;
        for gate in &gates {
            let answer = gate
                .observe_all_at(at, fanout, node.clone(), observations.clone())
                .await;
            Self::each(&mut failed, gate, answer);
        }
        failed.map_or(Ok(gates.len()), Err)
    }

    /// Feeds a SWIM fact to every pool that has the node without waiting
    /// for it to be applied (a membership feed that must not block).
    pub fn membership_nowait(&self, update: MembershipUpdate) {
        let at = self.shared.clock.now();
        let (node, observation) = update.into_observation();
        let (gates, fanout) = self.note(at, &node, std::slice::from_ref(&observation));
        for gate in gates {
            gate.observe_nowait(at, fanout, node.clone(), observation.clone());
        }
    }

    /// Notes what was observed of `node` at `at` in the fleet's facts
    /// (kept while the node is known or a candidate) and returns the pools
    /// to tell, and the way the observations go to them (numbered, for a
    /// recording). An observation no pool has that changes the facts is
    /// recorded here: a pool defined later is told it.
    fn note(&self, at: Time, node: &NodeId, observations: &[Observation]) -> (Vec<Gate>, Fanout) {
        let mut state = self.state();
        let State {
            candidacy,
            facts,
            gates,
            next_fanout,
        } = &mut *state;
        let holders: Vec<Gate> = candidacy
            .pools_of(node)
            .filter_map(|pool| gates.get(pool).cloned())
            .collect();
        let fanout = Fanout::Fleet(*next_fanout);
        *next_fanout += observations.len() as u64;
        let held = match facts.get_mut(node) {
            Some(held) => held,
            None => facts.entry(node.clone()).or_default(),
        };
        for observation in observations {
            let was_known = held.is_known();
            let applied = held.observe(observation);
            // Of a node no pool has, what the fleet keeps (a known node's
            // facts, and its forgetting) is what a later pool is told.
            let kept = was_known || held.is_known();
            if let (Some(recording), true) = (&self.shared.recording, holders.is_empty()) {
                if matches!(applied, poolgate_core::Applied::Changed(_)) && kept {
                    recording.observation(at, node.as_str(), observation, Fanout::Own);
                }
            }
        }
        if holders.is_empty() && !held.is_known() {
            facts.remove(node);
        }
        if holders.is_empty() {
            crate::telemetry::observation("non_candidate");
        }
        (holders, fanout)
    }

    /// Applies an input stamped `at` (a replay's record): an observation
    /// to every pool that has its node; a command to `pool`, or to the
    /// only pool when it names none (several pools: [`GateError::PoolRequired`]).
    /// A `define_pool` of a new id starts a pool with the fleet's window
    /// and policy.
    pub async fn submit(
        &self,
        at: Time,
        pool: Option<&PoolId>,
        input: Input,
    ) -> Result<Accepted, GateError> {
        match input {
            Input::Observation { node, observation } => {
                let reached = self.observe(at, node, observation).await?;
                Ok(Accepted::Observation(match reached {
                    0 => ObservationOutcome::NotCandidate,
                    _ => ObservationOutcome::Changed,
                }))
            }
            Input::Command(Command::DefinePool(definition)) => {
                let (window, policy) = self.shared.template;
                let settings = GateSettings::new(definition, window, policy)?;
                self.define_at(at, settings).await.map(|_| Accepted::Done)
            }
            command => {
                let gate = self.commanded(pool)?;
                gate.submit(at, command).await
            }
        }
    }

    /// The pool a command goes to.
    fn commanded(&self, pool: Option<&PoolId>) -> Result<Gate, GateError> {
        let state = self.state();
        match pool {
            Some(pool) => state
                .gates
                .get(pool)
                .cloned()
                .ok_or_else(|| GateError::UnknownPool(pool.clone())),
            None => {
                let mut gates = state.gates.values();
                match (gates.next(), gates.next()) {
                    (Some(only), None) => Ok(only.clone()),
                    (None, _) => Err(GateError::PoolRequired),
                    (Some(_), Some(_)) => Err(GateError::PoolRequired),
                }
            }
        }
    }

    /// Where each pool stands, by pool id.
    pub async fn reports(&self) -> Result<Vec<PoolReport>, GateError> {
        let gates: Vec<Gate> = self.state().gates.values().cloned().collect();
        let mut reports = Vec::with_capacity(gates.len());
        for gate in gates {
            reports.push(gate.report().await?);
        }
        Ok(reports)
    }

    /// The pool whose active run (planning or committed) is `run`, if any:
    /// what `run --end RUN` ends when it names no pool.
    pub async fn pool_running(&self, run: &RunId) -> Result<Option<Gate>, GateError> {
        let reports = self.reports().await?;
        Ok(reports
            .iter()
            .find(|r| r.run.as_ref() == Some(run))
            .and_then(|r| self.pool(&r.pool)))
    }

    /// The earliest timer any pool has pending.
    pub async fn pending_deadline(&self) -> Result<Option<Time>, GateError> {
        let gates: Vec<Gate> = self.state().gates.values().cloned().collect();
        let mut earliest: Option<Time> = None;
        for gate in gates {
            if let Some(due) = gate.pending_deadline().await? {
                earliest = Some(earliest.map_or(due, |e| e.min(due)));
            }
        }
        Ok(earliest)
    }

    /// Whether any pool's last write of its durable state failed.
    pub fn writes_failing(&self) -> bool {
        self.state().gates.values().any(Gate::writes_failing)
    }

    /// Whether [`Fleet::stop`] was called.
    pub fn is_stopped(&self) -> bool {
        self.shared.stream.is_closed()
    }

    /// Stops every pool and ends the fleet's stream.
    pub fn stop(&self) {
        let gates: Vec<Gate> = std::mem::take(&mut self.state().gates)
            .into_values()
            .collect();
        for gate in gates {
            gate.stop();
        }
        self.shared.stream.close();
        if let Some(recording) = &self.shared.recording {
            recording.close_all();
        }
    }
}
