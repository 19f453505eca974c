//! poolgate: the membership and pool-readiness gate of a distributed-run
//! orchestrator, as an actix actor subsystem.
//!
//! # Layout
//!
//! - `poolgate_actors` (the `actors/` crate): the pure state machines and
//!   the three actors (`NodeActor`, `PoolActor`, `RunActor`).
//! - [`config`]: `config.toml`, checked, with errors that name key and line.
//! - [`gate`]: the embedding API: start, feed, subscribe, report, plan.
//! - [`scenario`]: the JSON Lines scenario format.
//! - [`replay`]: the gate on a scenario and a virtual clock.
//! - [`render`]: events as JSON lines or as a readable timeline.
//! - [`timeline`]: `replay --timeline`, an SVG of every candidate's state.
//! - [`explain`]: `replay --explain`, the pool's state and blockers in words.
//! - `src/main.rs`: the `poolgate` command line.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod config;
pub mod demo;
pub mod explain;
pub mod gate;
pub mod render;
pub mod replay;
pub mod scenario;
pub mod swim;
pub mod timeline;

pub use config::{Config, ConfigError};
pub use gate::{Gate, GateError};
pub use poolgate_actors as actors;
