//! The pure core: one state machine per actor, no clock, no actix, no I/O.
//!
//! Each machine takes `now` as an argument and returns what happened (events
//! pushed onto an `out` vector) and when it next wants to be woken
//! (`deadline()`). Tests drive them directly.

pub mod event;
pub mod identity;
pub mod ids;
pub mod invariants;
pub mod node;
pub mod pool;
pub mod run;
pub mod time;

pub use event::{AbortReason, Event};
pub use identity::{Fingerprint, IdentityMaterial, InvalidIdentity, MAX_IDENTITY_BYTES};
pub use ids::{Epoch, InvalidId, NodeId, PoolId, RunId, MAX_ID_BYTES};
pub use node::{
    Applied, Blocker, FaultReason, Membership, NodeChange, NodeFacts, Observation, Reason,
    SwimState, Verdict, MAX_REASON_BYTES,
};
pub use pool::{
    CandidateSummary, DefinitionError, LastChange, NodeDetail, PoolDefinition, PoolPhase,
    PoolReadiness, Redefinition, SlotKey,
};
pub use run::{OnReadinessLost, PlanningPolicy, RunEnd, RunError, RunGuard, RunPhase};
pub use time::Time;
