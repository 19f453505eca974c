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

use poolgate_core::{
    Epoch, NodeChange, NodeDetail, NodeId, Observation, PoolDefinition, PoolReport, Refusal, RunId,
    SlotKey, Time,
};

/// What became of one observation.
#[derive(Clone, Copy, PartialEq, Eq, Debug, actix::MessageResponse)]
pub enum Outcome {
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

/// Handle → `NodeActor`: apply one observation, stamped with the instant
/// it entered the gate.
#[derive(Message, Debug)]
#[rtype(result = "Outcome")]
pub struct ApplyObservation {
    /// The instant the observation entered the gate.
    pub at: Time,
    /// What was observed about the actor's node.
    pub observation: Observation,
}

/// Handle → `NodeActor`: apply several observations of the node in order,
/// at one instant (what one agent frame says), in one trip.
#[derive(Message, Debug)]
#[rtype(result = "Vec<Outcome>")]
pub struct ApplyObservations {
    /// The instant they entered the gate.
    pub at: Time,
    /// What was observed, in the order it is applied.
    pub observations: Vec<Observation>,
}

/// `PoolActor` → `NodeActor`: re-send the node's verdict to a restarted
/// pool actor.
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct Resync {
    /// The instant the pool actor restarted.
    pub at: Time,
}

/// `NodeActor` → `PoolActor`: news of one candidate. One message type, so
/// a node actor holds a single way to its pool.
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub enum FromNode {
    /// The node's view changed.
    Changed(NodeChanged),
    /// The node's actor stopped.
    Stopped(NodeActorStopped),
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
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct TimerDue {
    pub(crate) generation: u64,
}

/// Handle → `PoolActor`: replace the candidate pool (SPEC §2).
#[derive(Message, Debug)]
#[rtype(result = "Result<(), Refusal>")]
pub struct DefinePool {
    /// The instant the command entered the gate.
    pub at: Time,
    /// The new pool.
    pub definition: PoolDefinition,
}

/// Handle → `PoolActor`: begin planning a run on the ready pool (SPEC §3).
#[derive(Message, Debug)]
#[rtype(result = "Result<Epoch, Refusal>")]
pub struct BeginPlanning {
    /// The instant the command entered the gate.
    pub at: Time,
    /// The run to plan.
    pub run: RunId,
    /// The epoch the caller saw ready, as proof, if it has one.
    pub epoch: Option<Epoch>,
}

/// Handle → `PoolActor`: commit a run's plan; provisioning begins.
#[derive(Message, Debug)]
#[rtype(result = "Result<(), Refusal>")]
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

/// Handle → `PoolActor`, and `PoolActor` → `RunActor`: end a committed
/// run.
#[derive(Message, Debug)]
#[rtype(result = "Result<(), Refusal>")]
pub struct FinishRun {
    /// The instant the command entered the gate.
    pub at: Time,
    /// The committed run.
    pub run: RunId,
}

/// Handle → `PoolActor`: where does the pool stand?
#[derive(Message, Debug)]
#[rtype(result = "PoolReport")]
pub struct GetReport {
    /// The instant the question was asked.
    pub at: Time,
}

/// Handle → `PoolActor`: the earliest timer pending (the replay runs the
/// clock until there is none).
#[derive(Message, Debug)]
#[rtype(result = "Option<Time>")]
pub struct PendingDeadline {
    /// The instant the question was asked.
    pub at: Time,
}

/// `PoolActor` → `RunActor`: a node the committed plan requires changed.
#[derive(Message, Debug)]
#[rtype(result = "RunStatus")]
pub struct RequiredNodeChanged {
    /// The instant the change was applied at.
    pub at: Time,
    /// The required node.
    pub node: NodeId,
    /// How its view changed.
    pub change: NodeChange,
}

/// `PoolActor` → `RunActor`: a restored run's confirmation deadline is due.
#[derive(Message, Debug)]
#[rtype(result = "RunStatus")]
pub struct ConfirmDue {
    /// The deadline.
    pub at: Time,
}

/// A committed run's answer: whether it goes on.
#[derive(Clone, Copy, PartialEq, Eq, Debug, actix::MessageResponse)]
pub enum RunStatus {
    /// Still provisioning or running.
    Active,
    /// Faulted or finished: final, and the run's actor stops.
    Ended,
}

/// Failures a test can inject into a node actor.
#[cfg(test)]
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "()")]
pub enum InjectFault {
    /// Panic inside the handler, where observations are applied.
    Panic,
    /// Stop the actor.
    Stop,
}

/// Failures a test can inject into the pool actor.
#[cfg(test)]
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "()")]
pub enum InjectPoolFault {
    /// Panic inside a handler, where the core is called.
    Panic,
}
