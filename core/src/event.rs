//! What the gate tells the orchestrator (design §5's event table, typed).

use std::collections::BTreeMap;

use serde::Serialize;

use crate::identity::Fingerprint;
use crate::ids::{Epoch, NodeId, PoolId, RunId};
use crate::node::Reason;
use crate::time::Time;

/// Why planning was abandoned.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum AbortReason {
    /// Readiness was lost while planning under the `abort` policy.
    ReadinessLost,
    /// Readiness did not come back within `wait_timeout` under `wait`.
    WaitTimeout,
    /// The gate restarted while the run was planning (design §9).
    Restarted,
    /// The orchestrator withdrew it: the run's requester is gone, or asked
    /// to end it before it was committed (design §3).
    Withdrawn,
}

/// One event of the gate. Each carries the instant it happened at; as JSON
/// it is a line of the replay format, and reads back:
///
/// ```
/// use poolgate_core::{Event, Reason};
///
/// let line = r#"{"event":"run_faulted","at_ms":1500,"pool":"pool-a","run":"run-1","node":"node-2","reason":"suspect"}"#;
/// let event: Event = serde_json::from_str(line).unwrap();
/// match &event {
///     Event::RunFaulted { node, reason, .. } => {
///         assert_eq!(node.as_str(), "node-2");
///         assert_eq!(*reason, Reason::Suspect);
///     }
///     other => panic!("{other:?}"),
/// }
/// assert_eq!(event.name(), "run_faulted");
/// assert_eq!(serde_json::to_string(&event).unwrap(), line);
/// ```
///
/// it is the replay format's event line (design §5), read back the same
/// (ids checked as when made).
#[derive(Clone, PartialEq, Eq, Debug, Serialize, serde::Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Event {
    /// Every candidate was ready and the view held still for the window.
    PoolReady {
        /// The instant it happened on the gate's timeline (`at_ms`).
        #[serde(rename = "at_ms")]
        at: Time,
        /// The pool's id.
        pool: PoolId,
        /// The new epoch.
        epoch: Epoch,
        /// The candidates, sorted.
        members: Vec<NodeId>,
        /// Each candidate's identity fingerprint.
        fingerprints: BTreeMap<NodeId, Fingerprint>,
    },
    /// The view changed while the pool was ready.
    ReadinessLost {
        /// The instant it happened on the gate's timeline (`at_ms`).
        #[serde(rename = "at_ms")]
        at: Time,
        /// The pool's id.
        pool: PoolId,
        /// The epoch that ended.
        epoch: Epoch,
        /// The node whose view changed; none when the pool was redefined.
        node: Option<NodeId>,
        /// What changed.
        reason: Reason,
    },
    /// A run began planning, bound to an epoch.
    PlanningStarted {
        /// The instant it happened on the gate's timeline (`at_ms`).
        #[serde(rename = "at_ms")]
        at: Time,
        /// The pool the run is on.
        pool: PoolId,
        /// The run it concerns.
        run: RunId,
        /// The epoch it is bound to.
        epoch: Epoch,
    },
    /// Readiness was lost while planning under the `wait` policy.
    PlanningSuspended {
        /// The instant it happened on the gate's timeline (`at_ms`).
        #[serde(rename = "at_ms")]
        at: Time,
        /// The pool the run is on.
        pool: PoolId,
        /// The run it concerns.
        run: RunId,
    },
    /// Readiness came back while planning was suspended.
    PlanningResumed {
        /// The instant it happened on the gate's timeline (`at_ms`).
        #[serde(rename = "at_ms")]
        at: Time,
        /// The pool the run is on.
        pool: PoolId,
        /// The run it concerns.
        run: RunId,
        /// The new epoch it is bound to.
        epoch: Epoch,
    },
    /// Planning ended without a plan.
    PlanningAborted {
        /// The instant it happened on the gate's timeline (`at_ms`).
        #[serde(rename = "at_ms")]
        at: Time,
        /// The pool the run is on.
        pool: PoolId,
        /// The run it concerns.
        run: RunId,
        /// Why planning was abandoned.
        reason: AbortReason,
    },
    /// The plan was committed: provisioning began.
    RunCommitted {
        /// The instant it happened on the gate's timeline (`at_ms`).
        #[serde(rename = "at_ms")]
        at: Time,
        /// The pool the run is on.
        pool: PoolId,
        /// The run it concerns.
        run: RunId,
        /// The epoch the plan was made on.
        epoch: Epoch,
        /// The nodes the plan requires, sorted.
        required: Vec<NodeId>,
    },
    /// A required node was lost after commit; the run is over.
    RunFaulted {
        /// The instant it happened on the gate's timeline (`at_ms`).
        #[serde(rename = "at_ms")]
        at: Time,
        /// The pool the run is on.
        pool: PoolId,
        /// The run it concerns.
        run: RunId,
        /// The required node that was lost.
        node: NodeId,
        /// How it was lost.
        reason: Reason,
    },
    /// A committed run finished.
    RunFinished {
        /// The instant it happened on the gate's timeline (`at_ms`).
        #[serde(rename = "at_ms")]
        at: Time,
        /// The pool the run is on.
        pool: PoolId,
        /// The run it concerns.
        run: RunId,
    },
}

impl Event {
    /// The pool the event is about (every event names its pool).
    pub fn pool(&self) -> &PoolId {
        match self {
            Event::PoolReady { pool, .. }
            | Event::ReadinessLost { pool, .. }
            | Event::PlanningStarted { pool, .. }
            | Event::PlanningSuspended { pool, .. }
            | Event::PlanningResumed { pool, .. }
            | Event::PlanningAborted { pool, .. }
            | Event::RunCommitted { pool, .. }
            | Event::RunFaulted { pool, .. }
            | Event::RunFinished { pool, .. } => pool,
        }
    }

    /// The instant the event happened at.
    pub fn at(&self) -> Time {
        match self {
            Event::PoolReady { at, .. }
            | Event::ReadinessLost { at, .. }
            | Event::PlanningStarted { at, .. }
            | Event::PlanningSuspended { at, .. }
            | Event::PlanningResumed { at, .. }
            | Event::PlanningAborted { at, .. }
            | Event::RunCommitted { at, .. }
            | Event::RunFaulted { at, .. }
            | Event::RunFinished { at, .. } => *at,
        }
    }

    /// The event's name as the replay format spells it.
    pub fn name(&self) -> &'static str {
        match self {
            Event::PoolReady { .. } => "pool_ready",
            Event::ReadinessLost { .. } => "readiness_lost",
            Event::PlanningStarted { .. } => "planning_started",
            Event::PlanningSuspended { .. } => "planning_suspended",
            Event::PlanningResumed { .. } => "planning_resumed",
            Event::PlanningAborted { .. } => "planning_aborted",
            Event::RunCommitted { .. } => "run_committed",
            Event::RunFaulted { .. } => "run_faulted",
            Event::RunFinished { .. } => "run_finished",
        }
    }
}
