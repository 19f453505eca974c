//! poolgate: the membership and pool-readiness gate of a distributed-run
//! orchestrator, as an actix actor subsystem.
//!
//! # Start here
//!
//! Depend on it without the command line (`poolgate = { version = "0.1",
//! default-features = false }`; [features](#features) below), load a
//! configuration, start the gate inside an actix `System`, feed it what
//! membership, the registry and the node agents say, and plan only on the
//! proof it gives:
//!
//! ```
//! use poolgate::core::{AgentReport, MembershipUpdate, NodeId, RegistryFact, RunId, SwimState};
//! use poolgate::{Config, Gate};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let config = Config::parse(
//!     "[pool]\nid = \"pool-a\"\nmembers = [\"node-1\"]\n\
//!      [readiness]\nconvergence_window = \"20ms\"\n",
//!     "config.toml",
//! )?;
//! actix::System::new().block_on(async move {
//!     let gate = Gate::try_start(config.gate_settings()?)?;
//!     let node = NodeId::new("node-1")?;
//!     gate.registry(RegistryFact::Known { node: node.clone() }).await?;
//!     let alive = MembershipUpdate { node: node.clone(), state: SwimState::Alive, incarnation: 1 };
//!     gate.membership(alive).await?;
//!     gate.agent(AgentReport::Available { node: node.clone() }).await?;
//!     gate.identity(node.clone(), b"data-plane key".to_vec()).await?;
//!     let ready = gate.wait_ready().await?;
//!     let run = RunId::new("run-1")?;
//!     gate.begin_planning(run.clone(), Some(ready.epoch)).await?;
//!     gate.commit_plan(run.clone(), vec![node], Some(ready.epoch)).await?;
//!     gate.finish_run(run).await?;
//!     Ok::<(), Box<dyn std::error::Error>>(())
//! })
//! # }
//! ```
//!
//! With SWIM and the node agents for real, [`live::Orchestrator`] starts
//! the gate, a SWIM member and the agent listener from the same
//! configuration; [`Gate::subscribe`] gives the events as they happen.
//!
//! # Layout
//!
//! - `poolgate_core` (the `core/` crate): the decisions, as pure state
//!   machines with no clock, no actors and no I/O; the one [`Input`] type;
//!   events; the readiness report.
//! - `poolgate_actors` (the `actors/` crate): the three actors around the
//!   core, behind one handle, [`Gate`].
//! - [`config`]: `config.toml`, checked, with errors that name key and
//!   line; the live cluster's sections in `config::cluster` (feature
//!   `live`).
//! - [`keys`] (feature `live`): key files, cluster keys and pinned
//!   public keys (from files or bytes).
//! - [`state`]: the durable state (redb, etcd).
//! - [`ha`]: replicas on etcd: the etcd client, the leadership and the
//!   runs asked of whichever replica leads (the last two with `live`).
//!   client.
//! - [`replay`]: the gate on a recorded scenario and a virtual clock: the
//!   file's reader ([`replay::scenario`]) and its renderers
//!   ([`replay::render`], [`replay::explain`], [`replay::timeline`]). The
//!   records themselves, written by the recording and read here, are
//!   `poolgate_actors::replay_format`'s.
//! - [`live`] (feature `live`): the live cluster: the embeddable
//!   [`live::Orchestrator`] and its replicas ([`ha::replica`]); the
//!   SWIM adapter (`live::swim`: foca and actix types, public for the
//!   command line and the simulator, hidden from the docs) and the demo
//!   (`cli::demo`).
//! - The simulator, thousands of SWIM members in virtual time feeding the
//!   real gate, is a crate of its own that is not published (`sim/`,
//!   `poolgate-sim`: `examples/swim_sim.rs`, `tests/gate/simulation.rs`).
//! - `src/main.rs`: the `poolgate` command line, thin.
//!
//! # Features
//!
//! - `live`: the live cluster: [`live::Orchestrator`] (the gate, a SWIM
//!   member and the agent listener from one [`Config`]), [`keys`], the
//!   signed and sealed wire, and the configuration's `[swim]`, `[agents]`,
//!   `[registry]` and `[demo]` sections. It brings foca, the Ed25519 and
//!   ChaCha20-Poly1305 crates and socket2. Without it the gate takes its
//!   membership from the embedder ([`Gate::membership`]) and those
//!   sections are refused by name.
//! - `redb` (default): `[state] path`, the durable state in one file.
//!   `[state] etcd` needs no feature.
//! - `cli` (default, with `live`, `redb` and `replay`): the `poolgate`
//!   binary and what only it needs: the node agent (`cli::node`),
//!   `watch`/`run` (`cli::commands`) and the guarded command
//!   (`cli::guard`), the demo and the local cluster; it brings clap,
//!   tracing-subscriber, the Prometheus exporter, nix and tokio's
//!   `process` and `signal`.
//! - `replay` (part of `cli`): `replay::run` and friends, the gate on a
//!   scenario and a paused tokio clock (tokio's `test-util`).
//!
//! An orchestrator that embeds the gate and [`live::Orchestrator`] depends
//! on `poolgate = { version = "0.1", default-features = false, features =
//! ["live"] }`; one that brings its own membership feed leaves `live` out
//! too.

#![forbid(unsafe_code)]
#![deny(missing_docs)]
// The crate's map links the feature-gated modules; built without them,
// those links have nothing to point at.
#![cfg_attr(not(feature = "cli"), allow(rustdoc::broken_intra_doc_links))]

#[cfg(feature = "cli")]
#[doc(hidden)]
pub mod cli;
pub mod config;
pub mod ha;
#[cfg(feature = "live")]
pub mod keys;
#[cfg(feature = "live")]
pub mod live;
#[cfg(feature = "replay")]
pub mod replay;
pub mod report;
pub mod state;

#[cfg(feature = "live")]
pub use config::NodeConfig;
pub use config::{Config, ConfigError, SettingsError};
pub use poolgate_actors::core::Input;

/// The gate's core: its ids, inputs, events, reasons and refusals
/// (`poolgate-core`, re-exported whole, with its pages here).
pub mod core {
    #[doc(inline)]
    pub use poolgate_actors::core::*;
}
/// Testing an embedder's code against the gate (feature `testing`):
/// virtual time, scripted inputs, an actor made to fail on its next
/// message.
#[cfg(feature = "testing")]
pub use poolgate_actors::testing;
/// What [`Gate::submit`] did (the replay's way in).
#[doc(hidden)]
pub use poolgate_actors::Accepted;
pub use poolgate_actors::{
    Clock, DurableSettings, EventStream, Fleet, Gate, GateError, GateSettings, ObservationOutcome,
    ReadyProof, Recording, StateStore, StoreError, TryRecvError, EVENT_QUEUE,
};
