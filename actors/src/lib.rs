//! poolgate's actor subsystem: the gate as three kinds of actor around the
//! pure core, behind one handle.
//!
//! An embedder (and the `poolgate` binary) uses [`Gate`], [`GateSettings`],
//! [`GateError`] and the core's types (re-exported as [`core`]): inputs,
//! events, ids and the readiness report. Actors and messages stay inside.
//! The handle lives here, not in the root crate, because it is the only
//! door to the actors: it needs their messages and addresses, and nothing
//! outside needs them.
//!
//! # Layout
//!
//! - [`gate`]: the handle: start, feed, subscribe, report, plan.
//! - `node_actor`: `NodeActor`, one per candidate; holds the node's facts
//!   and forwards only real changes.
//! - `pool_actor`: `PoolActor`, hosts the core's `PoolGate` (readiness,
//!   planning admission, policy), supervises the node actors, owns the
//!   pool's timer, publishes events, starts a run actor at each commit.
//! - `run_actor`: `RunActor`, one per committed run; owns its faults.
//! - `messages`: every message between the handle and the actors.
//! - `clock`, `publisher`, `router`: the clock and timers, the events' way
//!   out, and which node actor holds which candidate.
//! - [`telemetry`]: metrics through the `metrics` facade.
//!
//! Data flows one way: handle → node actor → pool actor → run actor; no
//! actor file imports another's that imports it back.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod clock;
pub mod gate;
mod messages;
mod node_actor;
mod pool_actor;
mod publisher;
pub mod recording;
mod router;
mod run_actor;
pub mod store;
pub mod telemetry;

#[cfg(test)]
mod failure_tests;

pub use clock::Clock;
pub use gate::{Accepted, EventStream, Gate, GateError, ReadyProof, TryRecvError, EVENT_QUEUE};
pub use messages::Outcome;
pub use pool_actor::{duration_problem, GateSettings, MAX_SETTING};
pub use poolgate_core as core;
pub use recording::Recording;
pub use store::{DurableSettings, StateStore, StoreError};
