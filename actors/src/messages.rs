//! Every message between the gate's handle and its three actors, in one
//! place, so the actor files import the core and these, not each other.
//!
//! The way of one observation: [`ApplyObservation`] (handle → `NodeActor`); only a
//! change goes on as [`NodeChanged`] (`NodeActor` → `PoolActor`, in a
//! [`FromNode`]); a change
//! of a node that a committed run requires goes on as
//! [`RequiredNodeChanged`] (`PoolActor` → `RunActor`), answered with the
//! run's [`RunStatus`].

use actix::Message;

use crate::error::GateError;

use poolgate_core::{
    Epoch, NodeChange, NodeDetail, NodeId, Observation, PoolDefinition, PoolReport, Refusal, RunId,
    SlotKey, Time,
};

/// What became of one observation.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ObservationOutcome {
    /// The node's view changed; the pool was told.
    Changed,
    /// The observation repeated the view.
    Duplicate,
    /// A SWIM observation older than the view, ignored.
    Stale,
    /// The node is not a candidate; ignored.
    NotCandidate,
    /// The node's actor failed while applying it; the actor was restarted
    /// with no facts, and the node counts as not ready until it reports
    /// again.
    Failed,
}

/// An answer a handler gives as it is: sent back to the asker, if it
/// waits (what actix's `MessageResponse` derive writes; the derive needs a
/// proc-macro crate every embedder would build).
macro_rules! answered_as_is {
    ($answer:ty) => {
        impl<A, M> actix::dev::MessageResponse<A, M> for $answer
        where
            A: actix::Actor,
            M: Message<Result = $answer>,
        {
            fn handle(self, _: &mut A::Context, tx: Option<actix::dev::OneshotSender<M::Result>>) {
                if let Some(tx) = tx {
                    let _ = tx.send(self);
                }
            }
        }
    };
}

answered_as_is!(ObservationOutcome);

/// Which way an observation came, for a fleet's recording (design §14).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fanout {
    /// Through a gate's own handle, or what a fleet told a pool of its
    /// members' facts when it defined it: recorded by the pool it changed.
    Own,
    /// Handed by a fleet to every pool that has its node, numbered: the
    /// first pool it changes records it, once.
    Fleet(u64),
}

impl Fanout {
    /// The way of the `i`-th of several observations that came together.
    pub fn nth(self, i: usize) -> Fanout {
        match self {
            Fanout::Fleet(first) => Fanout::Fleet(first + i as u64),
            other => other,
        }
    }
}

/// Handle → `NodeActor`: apply one observation, stamped with the instant
/// it entered the gate.
#[derive(Debug, Clone)]
pub struct ApplyObservation {
    /// The instant the observation entered the gate.
    pub at: Time,
    /// What was observed about the actor's node.
    pub observation: Observation,
    /// Which way it came (a fleet's recording).
    pub fanout: Fanout,
}

impl Message for ApplyObservation {
    type Result = ObservationOutcome;
}

/// Handle → `NodeActor`: apply several observations of the node in order,
/// at one instant (what one agent frame says), in one trip.
#[derive(Debug, Clone)]
pub struct ApplyObservations {
    /// The instant they entered the gate.
    pub at: Time,
    /// What was observed, in the order it is applied.
    pub observations: Vec<Observation>,
    /// Which way the first of them came (the next ones follow it).
    pub fanout: Fanout,
}

impl Message for ApplyObservations {
    type Result = Vec<ObservationOutcome>;
}

/// `Gate` → `PoolActor`: the gate stops for good (`Gate::stop`, or the
/// last handle dropped): every node actor and the run actor are stopped,
/// and the pool actor keeps nothing running.
#[derive(Debug)]
pub struct Shutdown;

impl Message for Shutdown {
    type Result = ();
}

/// `PoolActor` → `NodeActor`: stop (the gate stopped).
#[derive(Debug)]
pub struct StopNode;

impl Message for StopNode {
    type Result = ();
}

/// `PoolActor` → `NodeActor`: re-send the node's verdict to a restarted
/// pool actor.
#[derive(Debug)]
pub struct Resync {
    /// The instant the pool actor restarted.
    pub at: Time,
}

impl Message for Resync {
    type Result = ();
}

/// `NodeActor` → `PoolActor`: news of one candidate. One message type, so
/// a node actor holds a single way to its pool.
#[derive(Debug)]
pub enum FromNode {
    /// The node's view changed.
    Changed(NodeChanged),
    /// The node's actor stopped.
    Stopped(NodeActorStopped),
}

impl Message for FromNode {
    type Result = ();
}

/// The node's view changed.
#[derive(Debug)]
pub struct NodeChanged {
    /// The candidate's slot, as given to the node actor.
    pub key: SlotKey,
    /// The candidate whose view changed.
    pub node: NodeId,
    /// The instant the observation that changed it entered the gate.
    pub at: Time,
    /// The verdicts before and after, and the reason.
    pub change: NodeChange,
    /// The node's SWIM state and fault reason after it, for reports.
    pub detail: NodeDetail,
    /// The observation that made the change (none when the gate made it
    /// itself), for the recording.
    pub observation: Option<Observation>,
    /// Which way that observation came (a fleet's recording).
    pub fanout: Fanout,
}

/// A node actor stopped (it failed, or its node left the pool).
#[derive(Debug)]
pub struct NodeActorStopped {
    /// The slot the actor reported under.
    pub key: SlotKey,
    /// The node it held.
    pub node: NodeId,
}

/// The pool actor's own timer: the deadline armed under `generation` is
/// due.
#[derive(Debug)]
pub struct TimerDue {
    pub(crate) generation: u64,
}

impl Message for TimerDue {
    type Result = ();
}

/// Handle → `PoolActor`: replace the candidate pool (design §2).
#[derive(Debug)]
pub struct DefinePool {
    /// The instant the command entered the gate.
    pub at: Time,
    /// The new pool.
    pub definition: PoolDefinition,
}

impl Message for DefinePool {
    type Result = Result<(), GateError>;
}

/// Handle → `PoolActor`: begin planning a run on the ready pool (design §3).
#[derive(Debug)]
pub struct BeginPlanning {
    /// The instant the command entered the gate.
    pub at: Time,
    /// The run to plan.
    pub run: RunId,
    /// The epoch the caller saw ready, as proof, if it has one.
    pub epoch: Option<Epoch>,
}

impl Message for BeginPlanning {
    type Result = Result<Epoch, GateError>;
}

/// Handle → `PoolActor`: commit a run's plan; provisioning begins.
#[derive(Debug)]
pub struct CommitPlan {
    /// The instant the command entered the gate.
    pub at: Time,
    /// The planning run.
    pub run: RunId,
    /// The nodes the plan requires.
    pub required: Vec<NodeId>,
    /// The epoch the plan was made on, if the caller gives one.
    pub epoch: Option<Epoch>,
}

impl Message for CommitPlan {
    type Result = Result<(), GateError>;
}

/// Handle → `PoolActor`, and `PoolActor` → `RunActor`: end a committed
/// run.
#[derive(Debug)]
pub struct FinishRun {
    /// The instant the command entered the gate.
    pub at: Time,
    /// The committed run.
    pub run: RunId,
}

impl Message for FinishRun {
    type Result = Result<(), GateError>;
}

/// Handle → `PoolActor`: withdraw a run that is planning or suspended
/// (its requester is gone).
#[derive(Debug)]
pub struct AbortPlanning {
    /// The instant the command entered the gate.
    pub at: Time,
    /// The planning run.
    pub run: RunId,
}

impl Message for AbortPlanning {
    type Result = Result<(), GateError>;
}

/// `PoolActor` → `RunActor`: the committed run is finished (a
/// [`FinishRun`] the pool admitted).
#[derive(Debug)]
pub struct FinishCommitted {
    /// The instant the command entered the gate.
    pub at: Time,
}

impl Message for FinishCommitted {
    type Result = RunAnswer<Result<(), Refusal>>;
}

/// Handle → `PoolActor`: where does the pool stand?
#[derive(Debug)]
pub struct GetReport {
    /// The instant the question was asked.
    pub at: Time,
}

impl Message for GetReport {
    type Result = Result<PoolReport, GateError>;
}

/// Handle → `PoolActor`: the earliest timer pending (the replay runs the
/// clock until there is none).
#[derive(Debug)]
pub struct PendingDeadline {
    /// The instant the question was asked.
    pub at: Time,
}

impl Message for PendingDeadline {
    type Result = Result<Option<Time>, GateError>;
}

/// `PoolActor` → `RunActor`: a node the committed plan requires changed.
#[derive(Debug)]
pub struct RequiredNodeChanged {
    /// The instant the change was applied at.
    pub at: Time,
    /// The required node.
    pub node: NodeId,
    /// How its view changed.
    pub change: NodeChange,
}

impl Message for RequiredNodeChanged {
    type Result = RunAnswer;
}

/// `PoolActor` → `RunActor`: a restored run's confirmation deadline is due.
#[derive(Debug)]
pub struct ConfirmDue {
    /// The deadline.
    pub at: Time,
}

impl Message for ConfirmDue {
    type Result = RunAnswer;
}

/// A committed run's answer: whether it goes on.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum RunStatus {
    /// Still provisioning or running.
    Active,
    /// Faulted or finished: final, and the run's actor stops.
    Ended,
}

/// A committed run's answer to the pool: its status and the events it
/// produced, which the pool tells once what they change is stored
/// (a run's outcome is written before it is told).
#[derive(Debug)]
pub struct RunAnswer<T = RunStatus> {
    /// The answer proper.
    pub status: T,
    /// What the run's guard produced.
    pub events: Vec<poolgate_core::Event>,
}

answered_as_is!(RunAnswer);
answered_as_is!(RunAnswer<Result<(), Refusal>>);

/// Failures a test can inject into a node actor.
#[cfg(any(test, feature = "testing"))]
#[derive(Debug, Clone, Copy)]
pub enum InjectFault {
    /// Panic inside the handler, where observations are applied.
    Panic,
    /// Stop the actor.
    #[cfg_attr(not(test), allow(dead_code))]
    Stop,
}

#[cfg(any(test, feature = "testing"))]
impl Message for InjectFault {
    type Result = ();
}

/// Failures a test can inject into the pool actor.
#[cfg(any(test, feature = "testing"))]
#[derive(Debug, Clone, Copy)]
pub enum InjectPoolFault {
    /// Panic in a handler (as the core, the actor's code, or a tracing
    /// layer of the embedder's would).
    Panic,
    /// Make the committed run's actor panic on this message (as an
    /// embedder's hook it calls would).
    PanicRunActor,
    /// Panic in a handler, then again in the restart: the gate cannot go
    /// on.
    #[cfg_attr(not(test), allow(dead_code))]
    PanicAndFailRestart,
    /// Panic on the next node change, before the core hears of it.
    #[cfg_attr(not(test), allow(dead_code))]
    PanicOnNextChange,
    /// Panic in this handler and in every one after (a fault that comes
    /// back at every restart).
    #[cfg_attr(not(test), allow(dead_code))]
    PanicAlways,
}

#[cfg(any(test, feature = "testing"))]
impl Message for InjectPoolFault {
    type Result = ();
}
