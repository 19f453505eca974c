//! poolgate's actors and the pure state machines they host.
//!
//! # Layout
//!
//! - [`core`]: the decisions, with no clock, no actix and no I/O. One state
//!   machine per actor: [`core::NodeFacts`] (a node's facts and its
//!   readiness verdict), [`core::PoolReadiness`] (counts, convergence window,
//!   epochs) and [`core::RunGuard`] (planning policy, commit, faults).
//! - [`node_actor`]: `NodeActor`, one per candidate; forwards real changes.
//! - [`pool_actor`]: `PoolActor`, supervises the node actors, aggregates,
//!   owns the convergence timer and publishes events.
//! - [`run_actor`]: `RunActor`, one per run; takes over fault handling once
//!   the plan is committed.
//! - [`telemetry`]: metrics through the `metrics` facade.
//! - [`wiring`]: what the actors share (clock, publisher, timer slot, router).
//!
//! Data flows one way: an observation reaches its node's `NodeActor`; only a
//! change goes on to the `PoolActor`; the pool's news and, once committed,
//! the required nodes' changes go on to the `RunActor`.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub use poolgate_core as core;
pub mod node_actor;
pub mod pool_actor;
pub mod run_actor;
pub mod telemetry;
pub mod wiring;

#[cfg(test)]
mod failure_tests;
