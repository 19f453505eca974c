//! The embedding API (SPEC §6): start the gate inside a running actix
//! `System`, feed it the three kinds of input, subscribe to its events, ask
//! where it stands, and drive planning.
//!
//! ```no_run
//! # async fn demo(config: poolgate::Config) -> Result<(), poolgate::GateError> {
//! use poolgate::gate::{AgentReport, Gate, MembershipUpdate, RegistryFact};
//! use poolgate_actors::core::{NodeId, RunId, SwimState};
//!
//! let gate = Gate::start(&config);
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
use poolgate_actors::core::{
    DefinitionError, Epoch, Event, FaultReason, IdentityMaterial, InvalidId, InvalidIdentity,
    NodeId, Observation, PoolDefinition, PoolId, PoolPhase, RunError, RunId, SwimState, Time,
};
use poolgate_actors::node_actor::{Observe, Outcome};
use poolgate_actors::pool_actor::{
    BeginPlanning, CommitPlan, DefinePool, FinishRun, GetReport, PendingDeadline, PoolActor,
    PoolReport, PoolSettings,
};
use poolgate_actors::telemetry;
use poolgate_actors::wiring::{Clock, IgnoredCounts, Publisher, Router};
use tokio::sync::mpsc;

use crate::config::Config;

/// Why the gate refused something. Nothing changed, unless said otherwise.
#[derive(Debug, thiserror::Error)]
pub enum GateError {
    /// A planning command was refused.
    #[error(transparent)]
    Refused(#[from] RunError),
    /// An id is not valid.
    #[error(transparent)]
    InvalidId(#[from] InvalidId),
    /// Identity material is not valid; the node keeps the identity it had.
    #[error(transparent)]
    InvalidIdentity(#[from] InvalidIdentity),
    /// A pool definition is not valid.
    #[error(transparent)]
    InvalidPool(#[from] DefinitionError),
    /// The gate's actors have stopped (the `System` is shutting down).
    #[error("the gate has stopped")]
    Stopped,
}

impl GateError {
    /// A short stable code, as the replay's `rejected` event prints it.
    pub fn code(&self) -> &'static str {
        match self {
            GateError::Refused(e) => e.code(),
            GateError::InvalidId(_) => "invalid_id",
            GateError::InvalidIdentity(_) => "invalid_identity",
            GateError::InvalidPool(_) => "invalid_pool",
            GateError::Stopped => "stopped",
        }
    }
}

/// Membership input: a SWIM fact about one member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MembershipUpdate {
    /// The member.
    pub node: NodeId,
    /// Its state.
    pub state: SwimState,
    /// The incarnation the state was reported at.
    pub incarnation: u64,
}

/// Node-agent input: what a node says of itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgentReport {
    /// `NodeAvailable`.
    Available {
        /// The node.
        node: NodeId,
    },
    /// The node withdrew its availability.
    Unavailable {
        /// The node.
        node: NodeId,
    },
    /// Data-plane identity material.
    Identity {
        /// The node.
        node: NodeId,
        /// The material (only its fingerprint is ever shown).
        material: IdentityMaterial,
    },
    /// The node is faulted. Any reason is accepted: control characters
    /// become U+FFFD and it is cut to 1 KiB (a fault is never lost to its
    /// wording).
    Faulted {
        /// The node.
        node: NodeId,
        /// Why, in the node's words.
        reason: String,
    },
    /// The node's fault is cleared.
    Recovered {
        /// The node.
        node: NodeId,
    },
}

impl AgentReport {
    /// An identity report from raw bytes, checked (1 byte to 16 KiB).
    pub fn identity(node: NodeId, bytes: Vec<u8>) -> Result<Self, InvalidIdentity> {
        Ok(AgentReport::Identity {
            node,
            material: IdentityMaterial::new(bytes)?,
        })
    }
}

/// Registry input: what the orchestrator knows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegistryFact {
    /// The orchestrator knows the node.
    Known {
        /// The node.
        node: NodeId,
    },
    /// The orchestrator forgot the node.
    Forgotten {
        /// The node.
        node: NodeId,
    },
}

/// Any input or command, for callers that stamp time themselves (replay).
#[derive(Debug, Clone)]
pub enum Input {
    /// From SWIM.
    Membership(MembershipUpdate),
    /// From a node agent.
    Agent(AgentReport),
    /// From the orchestrator's registry.
    Registry(RegistryFact),
    /// Replace the candidate pool.
    DefinePool(PoolDefinition),
    /// Begin planning a run.
    BeginPlanning {
        /// The run.
        run: RunId,
        /// The epoch the caller saw ready, if any.
        epoch: Option<Epoch>,
    },
    /// Commit a run's plan.
    CommitPlan {
        /// The run.
        run: RunId,
        /// The nodes it requires.
        required: Vec<NodeId>,
        /// The epoch the plan was made on, if given.
        epoch: Option<Epoch>,
    },
    /// Finish a committed run.
    FinishRun {
        /// The run.
        run: RunId,
    },
}

/// What an accepted input did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accepted {
    /// An observation, and what became of it.
    Observation(Outcome),
    /// Planning began on this epoch.
    Planning(Epoch),
    /// A command was carried out.
    Done,
}

/// Proof that the pool was ready: present it to plan and commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadyProof {
    /// The pool.
    pub pool: PoolId,
    /// The epoch of that readiness.
    pub epoch: Epoch,
}

/// What [`Gate::push`] did with an input.
#[derive(Debug)]
pub enum Push {
    /// The observation went to this candidate's actor.
    Sent(NodeId),
    /// The node is not a candidate; ignored and counted.
    NotCandidate,
    /// A command: submit it with [`Gate::submit`].
    Command(Input),
}

/// An input taken apart: an observation about one node, or a command for
/// the pool actor.
enum Routed {
    Observation(NodeId, Observation),
    Command(Command),
}

/// The inputs that are commands.
enum Command {
    DefinePool(PoolDefinition),
    BeginPlanning {
        run: RunId,
        epoch: Option<Epoch>,
    },
    CommitPlan {
        run: RunId,
        required: Vec<NodeId>,
        epoch: Option<Epoch>,
    },
    FinishRun {
        run: RunId,
    },
}

impl From<Command> for Input {
    fn from(command: Command) -> Input {
        match command {
            Command::DefinePool(definition) => Input::DefinePool(definition),
            Command::BeginPlanning { run, epoch } => Input::BeginPlanning { run, epoch },
            Command::CommitPlan {
                run,
                required,
                epoch,
            } => Input::CommitPlan {
                run,
                required,
                epoch,
            },
            Command::FinishRun { run } => Input::FinishRun { run },
        }
    }
}

/// Checks an input and takes it apart.
fn split(input: Input) -> Result<Routed, GateError> {
    let (node, observation) = match input {
        Input::Membership(MembershipUpdate {
            node,
            state,
            incarnation,
        }) => (node, Observation::Swim { state, incarnation }),
        Input::Agent(report) => match report {
            AgentReport::Available { node } => (node, Observation::Available),
            AgentReport::Unavailable { node } => (node, Observation::Unavailable),
            AgentReport::Identity { node, material } => (node, Observation::Identity(material)),
            AgentReport::Faulted { node, reason } => (
                node,
                Observation::Faulted {
                    reason: FaultReason::new(&reason),
                },
            ),
            AgentReport::Recovered { node } => (node, Observation::Recovered),
        },
        Input::Registry(RegistryFact::Known { node }) => (node, Observation::Known),
        Input::Registry(RegistryFact::Forgotten { node }) => (node, Observation::Forgotten),
        Input::DefinePool(definition) => {
            return Ok(Routed::Command(Command::DefinePool(definition)))
        }
        Input::BeginPlanning { run, epoch } => {
            return Ok(Routed::Command(Command::BeginPlanning { run, epoch }))
        }
        Input::CommitPlan {
            run,
            required,
            epoch,
        } => {
            return Ok(Routed::Command(Command::CommitPlan {
                run,
                required,
                epoch,
            }))
        }
        Input::FinishRun { run } => return Ok(Routed::Command(Command::FinishRun { run })),
    };
    Ok(Routed::Observation(node, observation))
}

/// A subscription to the gate's events, in the order they were published.
pub type EventStream = mpsc::UnboundedReceiver<Event>;

/// The handle of a running gate. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Gate {
    pool: Addr<PoolActor>,
    router: Arc<Router>,
    publisher: Publisher,
    clock: Clock,
}

impl Gate {
    /// Starts the gate's actors on the current actix `System`, with the
    /// configured pool. Must be called from within a running `System`.
    pub fn start(config: &Config) -> Gate {
        Gate::start_with(config.pool_settings())
    }

    /// Starts the gate from settings built in code.
    pub fn start_with(settings: PoolSettings) -> Gate {
        let clock = Clock::start();
        let publisher = Publisher::default();
        let router = Arc::new(Router::default());
        let pool = PoolActor::launch(settings, clock, publisher.clone(), Arc::clone(&router));
        Gate {
            pool,
            router,
            publisher,
            clock,
        }
    }

    /// The gate's timeline (time since it started).
    pub fn clock(&self) -> Clock {
        self.clock
    }

    /// Every event from now on.
    pub fn subscribe(&self) -> EventStream {
        self.publisher.subscribe()
    }

    /// Feeds a SWIM membership fact.
    pub async fn membership(&self, update: MembershipUpdate) -> Result<Outcome, GateError> {
        self.observe(Input::Membership(update)).await
    }

    /// Feeds a node agent's report.
    pub async fn agent(&self, report: AgentReport) -> Result<Outcome, GateError> {
        self.observe(Input::Agent(report)).await
    }

    /// Feeds a node agent's identity material as the agent sent it: bytes
    /// that are not valid material (empty, over 16 KiB) are refused with
    /// [`GateError::InvalidIdentity`] and the node keeps the identity it had.
    pub async fn identity(&self, node: NodeId, bytes: Vec<u8>) -> Result<Outcome, GateError> {
        match AgentReport::identity(node, bytes) {
            Ok(report) => self.agent(report).await,
            Err(invalid) => {
                let refused = GateError::from(invalid);
                telemetry::rejected(refused.code());
                Err(refused)
            }
        }
    }

    /// Feeds a registry fact.
    pub async fn registry(&self, fact: RegistryFact) -> Result<Outcome, GateError> {
        self.observe(Input::Registry(fact)).await
    }

    /// Feeds a SWIM fact without waiting for it to be applied: for a
    /// membership feed that must not block (the SWIM adapter). Facts about
    /// one node keep their order; their order relative to commands sent
    /// meanwhile is not guaranteed.
    pub fn membership_nowait(&self, update: MembershipUpdate) {
        // A membership update always passes the checks (its id is already
        // valid), so there is no error to report.
        let _ = self.push(self.clock.now(), Input::Membership(update));
    }

    /// Replaces the candidate pool (refused while a run is committed).
    pub async fn define_pool(&self, definition: PoolDefinition) -> Result<(), GateError> {
        self.submit_now(Input::DefinePool(definition))
            .await
            .map(drop)
    }

    /// Begins planning `run` on the ready pool; `epoch` is the proof from
    /// [`Gate::wait_ready`] or a `PoolReady` event.
    pub async fn begin_planning(
        &self,
        run: RunId,
        epoch: Option<Epoch>,
    ) -> Result<Epoch, GateError> {
        match self.submit_now(Input::BeginPlanning { run, epoch }).await? {
            Accepted::Planning(epoch) => Ok(epoch),
            _ => Err(GateError::Stopped),
        }
    }

    /// Commits `run`'s plan over `required`: provisioning begins.
    pub async fn commit_plan(
        &self,
        run: RunId,
        required: Vec<NodeId>,
        epoch: Option<Epoch>,
    ) -> Result<(), GateError> {
        self.submit_now(Input::CommitPlan {
            run,
            required,
            epoch,
        })
        .await
        .map(drop)
    }

    /// Ends a committed run.
    pub async fn finish_run(&self, run: RunId) -> Result<(), GateError> {
        self.submit_now(Input::FinishRun { run }).await.map(drop)
    }

    /// Where the pool stands, per candidate: ready or what blocks it.
    pub async fn report(&self) -> Result<PoolReport, GateError> {
        self.pool
            .send(GetReport {
                at: self.clock.now(),
            })
            .await
            .map_err(|_| GateError::Stopped)
    }

    /// Waits until the pool is ready and returns the proof.
    pub async fn wait_ready(&self) -> Result<ReadyProof, GateError> {
        let mut events = self.subscribe();
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

    /// The earliest timer the pool or its run has pending.
    pub async fn pending_deadline(&self) -> Result<Option<Time>, GateError> {
        self.pool
            .send(PendingDeadline {
                at: self.clock.now(),
            })
            .await
            .map_err(|_| GateError::Stopped)
    }

    /// Applies an input stamped with an explicit instant. For replaying
    /// recorded input on a virtual clock: stamps must not go backwards, and
    /// an input stamped `T` must arrive before the clock reaches `T` for it
    /// to be applied before timers due at `T`.
    pub async fn submit(&self, at: Time, input: Input) -> Result<Accepted, GateError> {
        let result = match split(input) {
            Ok(Routed::Observation(node, observation)) => Ok(Accepted::Observation(
                self.route(at, node, observation).await,
            )),
            Ok(Routed::Command(command)) => self.command_at(at, command).await,
            Err(refused) => Err(refused),
        };
        if let Err(refused) = &result {
            telemetry::rejected(refused.code());
        }
        result
    }

    /// Hands an observation to its node's actor without waiting: a
    /// command is given back for [`Gate::submit`]. Observations about one
    /// node keep their order; their order relative to observations about
    /// other nodes, and to commands, is not kept (use [`Gate::submit`]
    /// where it matters, as replay does).
    pub fn push(&self, at: Time, input: Input) -> Result<Push, GateError> {
        match split(input)? {
            Routed::Observation(node, observation) => match self.router.route(&node) {
                Some(addr) => {
                    addr.do_send(Observe { at, observation });
                    Ok(Push::Sent(node))
                }
                None => {
                    IgnoredCounts::bump(&self.router.ignored.non_candidate);
                    telemetry::observation("non_candidate");
                    Ok(Push::NotCandidate)
                }
            },
            Routed::Command(command) => Ok(Push::Command(command.into())),
        }
    }

    async fn command_at(&self, at: Time, command: Command) -> Result<Accepted, GateError> {
        match command {
            Command::DefinePool(definition) => self
                .command(DefinePool { at, definition })
                .await
                .map(|_| Accepted::Done),
            Command::BeginPlanning { run, epoch } => self
                .command(BeginPlanning { at, run, epoch })
                .await
                .map(Accepted::Planning),
            Command::CommitPlan {
                run,
                required,
                epoch,
            } => self
                .command(CommitPlan {
                    at,
                    run,
                    required,
                    epoch,
                })
                .await
                .map(|_| Accepted::Done),
            Command::FinishRun { run } => self
                .command(FinishRun { at, run })
                .await
                .map(|_| Accepted::Done),
        }
    }

    async fn observe(&self, input: Input) -> Result<Outcome, GateError> {
        match self.submit_now(input).await? {
            Accepted::Observation(outcome) => Ok(outcome),
            _ => Err(GateError::Stopped),
        }
    }

    async fn submit_now(&self, input: Input) -> Result<Accepted, GateError> {
        self.submit(self.clock.now(), input).await
    }

    /// Hands an observation to its node's actor; waiting for the answer keeps
    /// observations and later commands in order.
    async fn route(&self, at: Time, node: NodeId, observation: Observation) -> Outcome {
        let Some(addr) = self.router.route(&node) else {
            IgnoredCounts::bump(&self.router.ignored.non_candidate);
            telemetry::observation("non_candidate");
            tracing::debug!(%node, "observation about a non-candidate ignored");
            return Outcome::NotCandidate;
        };
        match addr.send(Observe { at, observation }).await {
            Ok(outcome) => outcome,
            // The node left the pool while the observation was in flight.
            Err(_) => {
                IgnoredCounts::bump(&self.router.ignored.non_candidate);
                Outcome::NotCandidate
            }
        }
    }

    async fn command<M, T>(&self, message: M) -> Result<T, GateError>
    where
        M: actix::Message<Result = Result<T, RunError>> + Send + 'static,
        M::Result: Send,
        PoolActor: actix::Handler<M>,
        T: Send + 'static,
    {
        Ok(self
            .pool
            .send(message)
            .await
            .map_err(|_| GateError::Stopped)??)
    }
}
