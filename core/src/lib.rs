//! poolgate's decisions: one pure state machine per actor of the gate, with
//! no clock, no actors and no I/O (Cargo keeps it so: this crate depends on
//! none of them).
//!
//! # Start here
//!
//! Most embedders want the running gate, `poolgate_actors::Gate` (or the
//! `poolgate` crate, which re-exports it): it feeds these machines from
//! actors and a clock. Use this crate alone for its types (ids, inputs,
//! events, the readiness report), or to drive the decisions yourself, as
//! a simulation or a model check would. Each machine takes `now` as an
//! argument, pushes what happened onto an `out` vector, and says when it
//! next wants to be woken (`deadline()`):
//!
//! ```
//! use std::time::Duration;
//! use poolgate_core::{
//!     Event, Fingerprint, NodeFacts, NodeId, Observation, OnReadinessLost, PlanningPolicy,
//!     PoolDefinition, PoolMachine, PoolId, SwimState, Time, Applied,
//! };
//!
//! let node = NodeId::new("node-1").unwrap();
//! let pool = PoolDefinition::new(PoolId::new("pool-a").unwrap(), vec![node.clone()]).unwrap();
//! let policy = PlanningPolicy { on_readiness_lost: OnReadinessLost::Wait, wait_timeout: None };
//! let (mut gate, slots) = PoolMachine::new(&pool, Duration::from_secs(5), policy, Time::ZERO);
//! let (_, slot) = slots[0].clone();
//!
//! // A node actor's machine: the node's facts, one observation at a time.
//! let mut facts = NodeFacts::default();
//! let mut out = Vec::new();
//! for observation in [
//!     Observation::Known,
//!     Observation::Swim { state: SwimState::Alive, incarnation: 1 },
//!     Observation::Available,
//!     Observation::Identity(Fingerprint::of(b"data-plane key")),
//! ] {
//!     if let Applied::Changed(change) = facts.apply(observation) {
//!         gate.node_changed(slot, Time::ZERO, &change, &mut out);
//!     }
//! }
//! assert!(facts.verdict().is_ready());
//! assert!(out.is_empty(), "ready only once it held still for the window");
//!
//! // The pool's timer: at the deadline, the pool is ready.
//! let due = gate.deadline().expect("the window's end");
//! gate.on_deadline(due, &mut out);
//! assert!(matches!(&out[..], [Event::PoolReady { members, .. }] if members == &vec![node]));
//! ```

#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod event;
pub mod fleet;
pub mod identity;
pub mod ids;
pub mod input;
pub mod machine;
pub mod node;
pub mod plain;
pub mod pool;
pub mod run;
pub mod time;

pub use event::{AbortReason, Event};
pub use fleet::{Candidacy, Reservations};
pub use machine::{AdmittedCommit, Durable, DurableRun, PoolMachine, PoolReport};

pub use identity::{Fingerprint, IdentityMaterial, InvalidIdentity, MAX_IDENTITY_BYTES};
pub use ids::{Epoch, InvalidId, NodeId, PoolId, RunId, MAX_ID_BYTES};
pub use input::{AgentReport, Command, Input, MembershipUpdate, RegistryFact};
pub use node::{
    Applied, Blocker, FaultReason, Membership, NodeChange, NodeFacts, Observation, Reason,
    SwimState, Verdict, MAX_REASON_BYTES,
};
pub use plain::PlainMembership;
pub use pool::{
    CandidateSummary, DefinitionError, LastChange, NodeDetail, PoolDefinition, PoolPhase,
    PoolReadiness, Redefinition, SlotKey,
};
pub use run::{
    OnReadinessLost, PlanningPolicy, Refusal, RequiredNodes, RunEnd, RunGuard, RunPhase,
};
pub use time::Time;

#[cfg(any(test, feature = "testkit"))]
pub mod testkit;

#[cfg(test)]
mod test_support;
