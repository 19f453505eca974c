//! The one public face of the actor subsystem (design §6): start the gate
//! inside a running actix `System`, feed it the three kinds of input,
//! subscribe to its events, ask where it stands, and drive planning.
//!
//! ```no_run
//! # async fn demo(settings: poolgate_actors::GateSettings) -> Result<(), poolgate_actors::GateError> {
//! use poolgate_actors::core::{AgentReport, MembershipUpdate, NodeId, RegistryFact, RunId, SwimState};
//! use poolgate_actors::Gate;
//!
//! let gate = Gate::start(settings);
//! let node = NodeId::new("node-1")?;
//! gate.registry(RegistryFact::Known { node: node.clone() }).await?;
//! gate.membership(MembershipUpdate { node: node.clone(), state: SwimState::Alive, incarnation: 1 }).await?;
//! gate.agent(AgentReport::Available { node: node.clone() }).await?;
//! gate.agent(AgentReport::identity(node.clone(), b"key".to_vec())?).await?;
//! let ready = gate.wait_ready().await?;
//! let run = RunId::new("run-1")?;
//! gate.begin_planning(run.clone(), Some(ready.epoch)).await?;
//! gate.commit_plan(run, vec![node], Some(ready.epoch)).await?;
//! # Ok(()) }
//! ```

use std::sync::Arc;

use actix::Addr;

use crate::clock::Clock;
use crate::messages::{
    AbortPlanning, ApplyObservation, ApplyObservations, BeginPlanning, CommitPlan, DefinePool,
    Fanout, FinishRun, GetReport, ObservationOutcome, PendingDeadline,
};
use crate::node_actor::NodeActor;
use crate::pool_actor::PoolActor;
use crate::publisher::Publisher;
use crate::router::{ReplaceNode, Router};
use crate::settings::GateSettings;
use crate::telemetry::{self, IgnoredCounts};
use poolgate_core::{
    AgentReport, Command, Epoch, Event, Input, MembershipUpdate, NodeId, Observation,
    PoolDefinition, PoolId, PoolPhase, PoolReport, RegistryFact, RunId, Time,
};

pub use crate::error::GateError;

/// What an accepted input did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accepted {
    /// An observation, and what became of it.
    Observation(ObservationOutcome),
    /// Planning began on this epoch.
    Planning(Epoch),
    /// A command was carried out.
    Done,
}

/// Proof that the pool was ready: present it to plan and commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadyProof {
    /// The pool that was ready.
    pub pool: PoolId,
    /// The epoch of that readiness.
    pub epoch: Epoch,
}

pub use crate::publisher::{EventStream, TryRecvError, EVENT_QUEUE};

pub use crate::clock::SUBMIT_AHEAD;

/// Refuses a stamp more than [`SUBMIT_AHEAD`] past `clock`'s now.
pub(crate) fn stamp_not_ahead(clock: Clock, at: Time) -> Result<(), GateError> {
    let now = clock.now();
    if at.offset() > now.offset().saturating_add(SUBMIT_AHEAD) {
        return Err(GateError::StampAhead { at, now });
    }
    Ok(())
}

/// The handle of a running gate. Cheap to clone.
///
/// Start it inside an actix `System`, feed it facts, and plan on the proof
/// it gives:
///
/// ```
/// use std::time::Duration;
/// use poolgate_actors::core::{
///     AgentReport, Event, MembershipUpdate, NodeId, OnReadinessLost, PlanningPolicy,
///     PoolDefinition, PoolId, RegistryFact, RunId, SwimState,
/// };
/// use poolgate_actors::{Gate, GateSettings};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let node = NodeId::new("node-1")?;
/// let definition = PoolDefinition::new(PoolId::new("pool-a")?, vec![node.clone()])?;
/// let policy = PlanningPolicy { on_readiness_lost: OnReadinessLost::Wait, wait_timeout: None };
/// let settings = GateSettings::new(definition, Duration::from_millis(20), policy)?;
/// actix::System::new().block_on(async move {
///     let gate = Gate::start(settings);
///     let mut events = gate.subscribe();
///     gate.registry(RegistryFact::Known { node: node.clone() }).await?;
///     let alive = MembershipUpdate { node: node.clone(), state: SwimState::Alive, incarnation: 1 };
///     gate.membership(alive).await?;
///     gate.agent(AgentReport::Available { node: node.clone() }).await?;
///     gate.identity(node.clone(), b"data-plane key".to_vec()).await?;
///     // Every fact held still for the window: the proof to plan on.
///     let ready = gate.wait_ready().await?;
///     let run = RunId::new("run-1")?;
///     gate.begin_planning(run.clone(), Some(ready.epoch)).await?;
///     gate.commit_plan(run.clone(), vec![node.clone()], Some(ready.epoch)).await?;
///     // The node is suspected: the committed run faults.
///     let suspect = MembershipUpdate { node: node.clone(), state: SwimState::Suspect, incarnation: 1 };
///     gate.membership(suspect).await?;
///     loop {
///         match events.recv().await {
///             Some(Event::RunFaulted { run: faulted, .. }) => break assert_eq!(faulted, run),
///             Some(_) => continue,
///             None => panic!("the gate stopped"),
///         }
///     }
///     Ok::<(), Box<dyn std::error::Error>>(())
/// })
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct Gate {
    pub(crate) pool: Addr<PoolActor>,
    pub(crate) router: Arc<Router>,
    publisher: Publisher,
    clock: Clock,
    recording: Option<crate::recording::Recording>,
    /// Shared by every clone: the last one dropped stops the gate.
    _last: Arc<StopWhenDropped>,
}

/// Stops the gate when the last handle goes: its actors hold one another
/// (the pool its node actors' addresses, each node actor the pool's), so
/// without this they would outlive every handle.
#[derive(Debug)]
struct StopWhenDropped {
    pool: Addr<PoolActor>,
    publisher: Publisher,
    recording: Option<crate::recording::Recording>,
}

impl Drop for StopWhenDropped {
    fn drop(&mut self) {
        stop_gate(&self.pool, &self.publisher, self.recording.as_ref());
    }
}

/// Nothing is published or recorded from now on, every subscription ends,
/// and every actor of the gate stops.
fn stop_gate(
    pool: &Addr<PoolActor>,
    publisher: &Publisher,
    recording: Option<&crate::recording::Recording>,
) {
    publisher.close();
    if let Some(recording) = recording {
        recording.close();
    }
    pool.do_send(crate::messages::Shutdown);
}

impl Gate {
    /// Starts the gate's actors on the current actix `System`.
    ///
    /// # Panics
    ///
    /// Outside a running actix `System`, with [`GateError::NoSystem`]'s
    /// words, and on settings [`GateSettings::check`] refuses;
    /// [`Gate::try_start`] returns those errors instead.
    pub fn start(settings: GateSettings) -> Gate {
        match Gate::try_start(settings) {
            Ok(gate) => gate,
            Err(e) => panic!("Gate::start: {e}"),
        }
    }

    /// Starts the gate's actors on the current actix `System`, or says
    /// why not: settings that are not valid ([`GateError::InvalidSettings`],
    /// checked as `config.toml` is), or no `System` ([`GateError::NoSystem`]).
    pub fn try_start(settings: GateSettings) -> Result<Gate, GateError> {
        settings.check().map_err(GateError::InvalidSettings)?;
        // A System that has ended leaves itself as the thread's current
        // one; only a runtime that runs now can host the actors.
        if actix::System::try_current().is_none() || tokio::runtime::Handle::try_current().is_err()
        {
            return Err(GateError::NoSystem);
        }
        Ok(Gate::launch(settings, Clock::start(), None, None))
    }

    /// Starts the gate's actors on `clock`; one of a fleet's pools when
    /// `fleet` is given (its events also go to the fleet's stream, its
    /// commits take the fleet's reservations).
    pub(crate) fn launch(
        settings: GateSettings,
        clock: Clock,
        fleet: Option<(&Publisher, &crate::reservations::Reservations)>,
        started: Option<Time>,
    ) -> Gate {
        let publisher = Publisher::default();
        let reservations = fleet.map(|(stream, reservations)| {
            publisher.forward_to(stream.clone());
            reservations.clone()
        });
        let router = Arc::new(Router::default());
        let recording = settings.record.clone();
        let pool = PoolActor::launch(
            settings,
            clock,
            publisher.clone(),
            Arc::clone(&router),
            reservations,
            started,
        );
        let last = Arc::new(StopWhenDropped {
            pool: pool.clone(),
            publisher: publisher.clone(),
            recording: recording.clone(),
        });
        Gate {
            pool,
            router,
            publisher,
            clock,
            recording,
            _last: last,
        }
    }

    /// Stops the gate, at once and for good: nothing is published or
    /// recorded from now on, every subscription ends (after the events
    /// already published), every input, command and report is refused
    /// with [`GateError::Stopped`], and every actor of the gate stops
    /// (its node actors and run actor at once; the pool actor once the
    /// last handle is dropped). Dropping the last handle without calling
    /// it does the same.
    pub fn stop(&self) {
        stop_gate(&self.pool, &self.publisher, self.recording.as_ref());
    }

    /// How many of the gate's actors are alive (the pool actor, the node
    /// actors, the run actor), read through a probe that holds no handle:
    /// for tests that the gate's actors go when it stops or its last
    /// handle is dropped.
    #[doc(hidden)]
    pub fn actor_probe(&self) -> impl Fn() -> usize + Send + Sync + 'static {
        let live = Arc::clone(&self.router.live);
        move || live.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Stops the gate acting the moment `fence` says no (checked before
    /// every event is published and every input or command is taken):
    /// a replica's leadership, so that a process frozen past its lease
    /// (SIGSTOP, a stalled VM) publishes nothing when it wakes, even before
    /// it notices. Set once.
    pub fn fence_with(&self, fence: impl Fn() -> bool + Send + Sync + 'static) {
        self.publisher.fence_with(Arc::new(fence));
    }

    /// Whether the gate's last write of its durable state failed (and no
    /// write since succeeded): it tells no new epoch nor run outcome until
    /// one does. `false` without a store. An orchestrator's `/readyz`
    /// says not ready while it is so.
    pub fn writes_failing(&self) -> bool {
        self.publisher.is_unwritten()
    }

    /// Whether [`Gate::stop`] was called (on this gate or a clone).
    pub fn is_stopped(&self) -> bool {
        let stopped = self.publisher.is_closed();
        if stopped {
            if let Some(recording) = &self.recording {
                recording.close();
            }
        }
        stopped
    }

    /// The gate's timeline (time since it started).
    pub fn clock(&self) -> Clock {
        self.clock
    }

    /// Every event from now on; the first subscription also gets the events
    /// of the gate's start (the restore events: `planning_aborted`
    /// `restarted`, …), so subscribing after an `.await` does not miss them. Each subscription
    /// holds at most [`EVENT_QUEUE`] unread events and counts what it lost
    /// beyond ([`EventStream::lagged`]).
    pub fn subscribe(&self) -> EventStream {
        self.publisher.subscribe()
    }

    /// Every event published from now on only: unlike [`Gate::subscribe`],
    /// never the events of the gate's start (for a helper beside the
    /// embedder's own subscriber, which keeps them).
    pub fn subscribe_from_now(&self) -> EventStream {
        self.publisher.subscribe_from_now()
    }

    /// Feeds a SWIM membership fact, admitted by SWIM's precedence (design
    /// §1): only `alive` at a higher incarnation refutes a suspicion. A
    /// source that keeps no incarnations (heartbeats, a cloud API) goes
    /// through [`core::PlainMembership`](crate::core::PlainMembership),
    /// which gives each change the incarnation the gate admits.
    pub async fn membership(
        &self,
        update: MembershipUpdate,
    ) -> Result<ObservationOutcome, GateError> {
        let (node, observation) = update.into_observation();
        self.route(self.clock.now(), Fanout::Own, node, observation)
            .await
    }

    /// Feeds a node agent's report.
    pub async fn agent(&self, report: AgentReport) -> Result<ObservationOutcome, GateError> {
        let (node, observation) = report.into_observation();
        self.route(self.clock.now(), Fanout::Own, node, observation)
            .await
    }

    /// Feeds a node agent's identity material as the agent sent it: bytes
    /// that are not valid material (empty, over 16 KiB) are refused with
    /// [`GateError::InvalidIdentity`] and the node keeps the identity it had.
    pub async fn identity(
        &self,
        node: NodeId,
        bytes: Vec<u8>,
    ) -> Result<ObservationOutcome, GateError> {
        match AgentReport::identity(node, bytes) {
            Ok(report) => self.agent(report).await,
            Err(invalid) => Err(Self::counted(invalid.into())),
        }
    }

    /// Feeds several observations of one node as one input: applied in
    /// order, at one instant, in one trip to the node's actor (what one
    /// agent frame says: its SWIM identity, its identity material, its
    /// fault, its availability). One outcome each: the node not a
    /// candidate, none applied, each `NotCandidate` (and counted, as one
    /// at a time would be); its actor failing part way, the rest
    /// `Failed`.
    pub async fn observe_all(
        &self,
        node: NodeId,
        observations: Vec<Observation>,
    ) -> Result<Vec<ObservationOutcome>, GateError> {
        self.observe_all_at(self.clock.now(), Fanout::Own, node, observations)
            .await
    }

    /// As [`Gate::observe_all`], stamped `at`, come `fanout`'s way.
    pub(crate) async fn observe_all_at(
        &self,
        at: Time,
        fanout: Fanout,
        node: NodeId,
        observations: Vec<Observation>,
    ) -> Result<Vec<ObservationOutcome>, GateError> {
        if self.is_stopped() {
            return Err(GateError::Stopped);
        }
        let count = observations.len();
        if count == 0 {
            return Ok(Vec::new());
        }
        // Ignored observations are counted each, as one at a time would be.
        let Some(addr) = self.router.route(&node) else {
            for _ in 0..count {
                self.not_candidate(&node);
            }
            return Ok(vec![ObservationOutcome::NotCandidate; count]);
        };
        match self
            .to_node(
                addr,
                &node,
                ApplyObservations {
                    at,
                    observations,
                    fanout,
                },
            )
            .await
        {
            Some(mut outcomes) => {
                // The actor failed part way: the rest was not applied.
                outcomes.resize(count, ObservationOutcome::Failed);
                Ok(outcomes)
            }
            None => {
                for _ in 0..count {
                    IgnoredCounts::bump(&self.router.ignored.non_candidate);
                }
                Ok(vec![ObservationOutcome::NotCandidate; count])
            }
        }
    }

    /// Feeds a registry fact.
    pub async fn registry(&self, fact: RegistryFact) -> Result<ObservationOutcome, GateError> {
        let (node, observation) = fact.into_observation();
        self.route(self.clock.now(), Fanout::Own, node, observation)
            .await
    }

    /// Feeds a SWIM fact without waiting for it to be applied: for a
    /// membership feed that must not block (the SWIM adapter). Facts about
    /// one node keep their order; their order relative to commands sent
    /// meanwhile is not guaranteed.
    pub fn membership_nowait(&self, update: MembershipUpdate) {
        let (node, observation) = update.into_observation();
        self.observe_nowait(self.clock.now(), Fanout::Own, node, observation);
    }

    /// Feeds an observation stamped `at`, come `fanout`'s way, without
    /// waiting for it to be applied.
    pub(crate) fn observe_nowait(
        &self,
        at: Time,
        fanout: Fanout,
        node: NodeId,
        observation: Observation,
    ) {
        if self.is_stopped() {
            return;
        }
        match self.router.route(&node) {
            Some(addr) => addr.do_send(ApplyObservation {
                at,
                observation,
                fanout,
            }),
            None => self.not_candidate(&node),
        }
    }

    /// Replaces the candidate pool (refused while a run is committed).
    pub async fn define_pool(&self, definition: PoolDefinition) -> Result<(), GateError> {
        let at = self.clock.now();
        self.ask(DefinePool { at, definition }).await
    }

    /// Begins planning `run` on the ready pool; `epoch` is the proof from
    /// [`Gate::wait_ready`] or a `PoolReady` event.
    pub async fn begin_planning(
        &self,
        run: RunId,
        epoch: Option<Epoch>,
    ) -> Result<Epoch, GateError> {
        let at = self.clock.now();
        self.ask(BeginPlanning { at, run, epoch }).await
    }

    /// Commits `run`'s plan over `required` (not empty): provisioning
    /// begins.
    pub async fn commit_plan(
        &self,
        run: RunId,
        required: Vec<NodeId>,
        epoch: Option<Epoch>,
    ) -> Result<(), GateError> {
        let at = self.clock.now();
        self.ask(CommitPlan {
            at,
            run,
            required,
            epoch,
        })
        .await
    }

    /// Ends a committed run.
    pub async fn finish_run(&self, run: RunId) -> Result<(), GateError> {
        let at = self.clock.now();
        self.ask(FinishRun { at, run }).await
    }

    /// Withdraws `run` while it is planning or suspended (its requester is
    /// gone, or asked to end it before its commit): `planning_aborted` with
    /// reason `withdrawn`, and the pool is free for the next run. A
    /// committed run is refused `not_planning` (end it with
    /// [`Gate::finish_run`]).
    pub async fn abort_planning(&self, run: RunId) -> Result<(), GateError> {
        let at = self.clock.now();
        self.ask(AbortPlanning { at, run }).await
    }

    /// Where the pool stands, per candidate: ready or what blocks it.
    pub async fn report(&self) -> Result<PoolReport, GateError> {
        if self.is_stopped() {
            return Err(GateError::Stopped);
        }
        let at = self.clock.now();
        self.pool
            .send(GetReport { at })
            .await
            .map_err(|_| GateError::Stopped)?
    }

    /// Waits until the pool is ready and returns the proof.
    pub async fn wait_ready(&self) -> Result<ReadyProof, GateError> {
        let mut events = self.publisher.subscribe_from_now();
        let report = self.report().await?;
        if let PoolPhase::Ready { epoch } = report.phase {
            return Ok(ReadyProof {
                pool: report.pool,
                epoch,
            });
        }
        while let Some(event) = events.recv().await {
            if let Event::PoolReady { pool, epoch, .. } = event {
                return Ok(ReadyProof { pool, epoch });
            }
        }
        Err(GateError::Stopped)
    }

    /// The earliest timer the pool has pending.
    pub async fn pending_deadline(&self) -> Result<Option<Time>, GateError> {
        if self.is_stopped() {
            return Err(GateError::Stopped);
        }
        let at = self.clock.now();
        self.pool
            .send(PendingDeadline { at })
            .await
            .map_err(|_| GateError::Stopped)?
    }

    /// Applies an input stamped with an explicit instant. For replaying
    /// recorded input on a virtual clock: stamps must not go backwards, and
    /// an input stamped `T` must arrive before the clock reaches `T` for it
    /// to be applied before timers due at `T`, and no more than
    /// [`SUBMIT_AHEAD`] before ([`GateError::StampAhead`]: applied, it
    /// would move the gate's time on by as much). The replay's way in
    /// (`poolgate replay`); an embedder feeds the gate with the typed
    /// calls above.
    #[doc(hidden)]
    pub async fn submit(&self, at: Time, input: Input) -> Result<Accepted, GateError> {
        stamp_not_ahead(self.clock, at)?;
        match input {
            Input::Observation { node, observation } => self
                .route(at, Fanout::Own, node, observation)
                .await
                .map(Accepted::Observation),
            Input::Command(Command::DefinePool(definition)) => self
                .ask(DefinePool { at, definition })
                .await
                .map(|()| Accepted::Done),
            Input::Command(Command::BeginPlanning { run, epoch }) => self
                .ask(BeginPlanning { at, run, epoch })
                .await
                .map(Accepted::Planning),
            Input::Command(Command::CommitPlan {
                run,
                required,
                epoch,
            }) => self
                .ask(CommitPlan {
                    at,
                    run,
                    required,
                    epoch,
                })
                .await
                .map(|()| Accepted::Done),
            Input::Command(Command::FinishRun { run }) => self
                .ask(FinishRun { at, run })
                .await
                .map(|()| Accepted::Done),
            Input::Command(Command::AbortPlanning { run }) => self
                .ask(AbortPlanning { at, run })
                .await
                .map(|()| Accepted::Done),
        }
    }

    /// Counts a refusal made before the input reached the gate (the replay
    /// reads invalid identity material and pool definitions as such).
    #[doc(hidden)]
    pub fn count_rejection(&self, refused: &GateError) {
        telemetry::rejected(refused.code());
    }

    /// Hands an observation to its node's actor; waiting for the answer keeps
    /// observations and later commands in order. `fanout`: which way it
    /// came.
    pub(crate) async fn route(
        &self,
        at: Time,
        fanout: Fanout,
        node: NodeId,
        observation: Observation,
    ) -> Result<ObservationOutcome, GateError> {
        if self.is_stopped() {
            return Err(GateError::Stopped);
        }
        let Some(addr) = self.router.route(&node) else {
            self.not_candidate(&node);
            return Ok(ObservationOutcome::NotCandidate);
        };
        match self
            .to_node(
                addr,
                &node,
                ApplyObservation {
                    at,
                    observation,
                    fanout,
                },
            )
            .await
        {
            Some(outcome) => Ok(outcome),
            // The node left the pool while the observation was in flight.
            None => {
                IgnoredCounts::bump(&self.router.ignored.non_candidate);
                Ok(ObservationOutcome::NotCandidate)
            }
        }
    }

    /// Sends `message` to `node`'s actor at `addr`. An actor that ended
    /// with it in flight (it failed) is replaced by the pool, and the
    /// message goes to the new one: an input is applied, not lost to a
    /// restart. `None` once the node is no longer a candidate.
    async fn to_node<M>(
        &self,
        addr: Addr<NodeActor>,
        node: &NodeId,
        message: M,
    ) -> Option<M::Result>
    where
        M: actix::Message + Clone + Send + 'static,
        M::Result: Send,
        NodeActor: actix::Handler<M>,
    {
        if let Ok(answer) = addr.send(message.clone()).await {
            return Some(answer);
        }
        let replaced = self
            .pool
            .send(ReplaceNode { node: node.clone() })
            .await
            .ok()
            .flatten()?;
        replaced.send(message).await.ok()
    }

    fn not_candidate(&self, node: &NodeId) {
        IgnoredCounts::bump(&self.router.ignored.non_candidate);
        telemetry::observation("non_candidate");
        crate::telemetry::said!(debug, %node, "observation about a non-candidate ignored");
    }

    /// Sends a command to the pool actor; a refusal is counted.
    async fn ask<M, T, E>(&self, message: M) -> Result<T, GateError>
    where
        M: actix::Message<Result = Result<T, E>> + Send + 'static,
        E: Into<GateError> + Send + 'static,
        M::Result: Send,
        PoolActor: actix::Handler<M>,
        T: Send + 'static,
    {
        if self.is_stopped() {
            return Err(GateError::Stopped);
        }
        let answer = self
            .pool
            .send(message)
            .await
            .map_err(|_| GateError::Stopped)?;
        answer.map_err(|refused| Self::counted(refused.into()))
    }

    fn counted(refused: GateError) -> GateError {
        telemetry::rejected(refused.code());
        refused
    }
}
