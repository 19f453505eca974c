//! poolgate's actor subsystem: the gate as three kinds of actor around the
//! pure core, behind one handle, [`Gate`].
//!
//! # Start here
//!
//! Start a gate inside an actix `System` from [`GateSettings`] (the pool,
//! the convergence window, the planning policy), feed it what your
//! membership source and node agents say, and plan on the proof that the
//! pool is ready; subscribe for the events:
//!
//! ```
//! use std::time::Duration;
//! use poolgate_actors::core::{
//!     AgentReport, MembershipUpdate, NodeId, OnReadinessLost, PlanningPolicy, PoolDefinition,
//!     PoolId, RegistryFact, RunId, SwimState,
//! };
//! use poolgate_actors::{Gate, GateSettings};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let node = NodeId::new("node-1")?;
//! let definition = PoolDefinition::new(PoolId::new("pool-a")?, vec![node.clone()])?;
//! let policy = PlanningPolicy { on_readiness_lost: OnReadinessLost::Abort, wait_timeout: None };
//! // Checked as config.toml is: a zero window, say, is an error here.
//! let settings = GateSettings::new(definition, Duration::from_millis(20), policy)?;
//! actix::System::new().block_on(async move {
//!     let gate = Gate::try_start(settings)?; // an error outside a System, or on bad settings
//!     gate.registry(RegistryFact::Known { node: node.clone() }).await?;
//!     gate.membership(MembershipUpdate { node: node.clone(), state: SwimState::Alive, incarnation: 1 })
//!         .await?;
//!     gate.agent(AgentReport::Available { node: node.clone() }).await?;
//!     gate.identity(node.clone(), b"data-plane key".to_vec()).await?;
//!     let ready = gate.wait_ready().await?;
//!     let run = RunId::new("run-1")?;
//!     gate.begin_planning(run.clone(), Some(ready.epoch)).await?;
//!     gate.commit_plan(run.clone(), vec![node], Some(ready.epoch)).await?;
//!     gate.finish_run(run).await?;
//!     gate.stop();
//!     Ok::<(), Box<dyn std::error::Error>>(())
//! })
//! # }
//! ```
//!
//! A membership source other than SWIM feeds [`Gate::membership`]
//! through [`core::PlainMembership`], which gives each change the
//! incarnation SWIM's precedence admits ([`core::Membership::admits`]);
//! a durable store goes in
//! [`GateSettings::durable`] ([`StateStore`]). The `poolgate` crate adds
//! the live cluster (SWIM, signed node agents, `Orchestrator`) on top.
//!
//! The types an embedder uses are [`Gate`], [`GateSettings`],
//! [`GateError`], [`EventStream`] and the core's (re-exported as
//! [`core`]): inputs, events, ids and the readiness report. Actors and
//! messages stay inside. The handle lives here, not in the root crate,
//! because it is the only door to the actors: it needs their messages and
//! addresses, and nothing outside needs them.
//!
//! # How it is built
//!
//! - [`gate`]: the handle: start, feed, subscribe, report, plan.
//! - `node_actor`: `NodeActor`, one per candidate; holds the node's facts
//!   and forwards only real changes.
//! - `pool_actor`: `PoolActor`, hosts the core's `PoolMachine` (readiness,
//!   planning admission, policy), supervises the node actors, owns the
//!   pool's timer, publishes events, starts a run actor at each commit.
//! - `run_actor`: `RunActor`, one per committed run; owns its faults.
//! - `messages`: every message between the handle and the actors.
//! - `clock`, `publisher`, `router`: the clock and timers, the events' way
//!   out, and which node actor holds which candidate.
//! - [`telemetry`]: metrics through the `metrics` facade.
//! - [`recording`], [`replay_format`]: `--record`, and the replay format
//!   it writes and `poolgate replay` reads (each record type once).
//! - [`store`]: what a durable gate keeps, and where.
//!
//! Data flows one way: handle → node actor → pool actor → run actor; no
//! actor file imports another's that imports it back.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod clock;
mod error;
pub mod fleet;
pub mod gate;
mod messages;
mod node_actor;
mod pool_actor;
mod publisher;
pub mod recording;
pub mod replay_format;
mod reservations;
mod router;
mod run_actor;
mod settings;
pub mod store;
pub mod telemetry;
#[cfg(feature = "testing")]
pub mod testing;

#[cfg(test)]
mod failure_tests;

pub use clock::Clock;
pub use error::GateError;
pub use fleet::Fleet;
pub use gate::{Accepted, EventStream, Gate, ReadyProof, TryRecvError, EVENT_QUEUE};
pub use messages::ObservationOutcome;
pub use settings::{duration_problem, wait_timeout_problem, GateSettings, MAX_SETTING};
/// The gate's core: its ids, inputs, events, reasons and refusals
/// (`poolgate-core`, re-exported whole, with its pages here).
pub mod core {
    #[doc(inline)]
    pub use poolgate_core::*;
}
pub use recording::Recording;
pub use store::{DurableSettings, StateStore, StoreError};
