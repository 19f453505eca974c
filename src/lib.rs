//! poolgate: the membership and pool-readiness gate of a distributed-run
//! orchestrator, as an actix actor subsystem.
//!
//! # Layout
//!
//! - `poolgate_core` (the `core/` crate): the decisions, as pure state
//!   machines with no clock, no actors and no I/O; the one [`Input`] type;
//!   events; the readiness report.
//! - `poolgate_actors` (the `actors/` crate): the three actors around the
//!   core, behind one handle, [`Gate`].
//! - [`config`]: `config.toml`, checked, with errors that name key and line.
//! - [`replay`]: the gate on a recorded scenario and a virtual clock, with
//!   its format ([`replay::scenario`]) and its renderers
//!   ([`replay::render`], [`replay::explain`], [`replay::timeline`]).
//! - [`live`]: the live cluster: the SWIM adapter ([`live::swim`]) and the
//!   demo ([`live::demo`]).
//! - [`sim`]: thousands of SWIM members in virtual time feeding the real
//!   gate (`examples/swim_sim.rs`, `tests/simulation.rs`).
//! - `src/main.rs`: the `poolgate` command line, thin.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod config;
pub mod live;
pub mod replay;
pub mod sim;
pub mod state;

pub use config::{Config, ConfigError, NodeConfig};
pub use poolgate_actors::core::{self, Input};
pub use poolgate_actors::{
    Accepted, DurableSettings, EventStream, Gate, GateError, GateSettings, Outcome, ReadyProof,
    Recording, StateStore, StoreError, EVENT_QUEUE,
};
