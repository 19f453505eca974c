//! poolgate's decisions: one pure state machine per actor of the gate, with
//! no clock, no actors and no I/O (Cargo keeps it so: this crate depends on
//! none of them).
//!
//! Each machine takes `now` as an argument and returns what happened (events
//! pushed onto an `out` vector) and when it next wants to be woken
//! (`deadline()`). Tests drive them directly.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod event;
pub mod gate;
pub mod identity;
pub mod ids;
pub mod input;
pub mod node;
pub mod pool;
pub mod run;
pub mod time;

pub use event::{AbortReason, Event};
pub use gate::{Durable, DurableRun, PoolGate, PoolReport};
pub use identity::{Fingerprint, IdentityMaterial, InvalidIdentity, MAX_IDENTITY_BYTES};
pub use ids::{Epoch, InvalidId, NodeId, PoolId, RunId, MAX_ID_BYTES};
pub use input::{AgentReport, Command, Input, MembershipUpdate, RegistryFact};
pub use node::{
    Applied, Blocker, FaultReason, Membership, NodeChange, NodeFacts, Observation, Reason,
    SwimState, Verdict, MAX_REASON_BYTES,
};
pub use pool::{
    CandidateSummary, DefinitionError, LastChange, NodeDetail, PoolDefinition, PoolPhase,
    PoolReadiness, Redefinition, SlotKey,
};
pub use run::{OnReadinessLost, PlanningPolicy, Refusal, RunEnd, RunGuard, RunPhase};
pub use time::Time;

#[cfg(any(test, feature = "testkit"))]
pub mod testkit;

#[cfg(test)]
mod test_support;
