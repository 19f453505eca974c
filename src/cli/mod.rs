//! The `poolgate` command line and what only it needs (the `cli`
//! feature): the node agent, `watch` and `run`, the guarded command, the
//! demo and the local cluster it runs on.
//!
//! - [`node`]: `poolgate node`, the daemon on every candidate node.
//! - [`commands`]: `poolgate watch` and what `watch` and `run` share.
//! - [`run`]: `poolgate run`, one path alone or among replicas.
//! - [`guard`]: commands that die with their guard (the keeper).
//! - [`health`]: what `--metrics` serves (metrics, health, status).
//! - [`demo`]: `cargo run`, the live story from forming to a fault.
//! - [`cluster`]: a whole cluster on 127.0.0.1 (the demo's, the tests').
//! - [`notify`]: systemd's readiness protocol (`Type=notify`).
//! - [`say`]: a command's answer on stderr, as text or JSON.

pub mod cluster;
pub mod commands;
pub mod demo;
pub mod guard;
pub mod health;
pub mod node;
pub mod notify;
pub mod run;
pub mod say;
