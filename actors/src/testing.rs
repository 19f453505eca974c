//! Testing an embedder's code against the gate the way poolgate tests
//! itself (feature `testing`): virtual time, scripted inputs, and an
//! actor made to fail on its next message.
//!
//! ```
//! use poolgate_actors::core::{NodeId, OnReadinessLost, PlanningPolicy, PoolDefinition, PoolId};
//! use poolgate_actors::testing::{advance_by, make_ready, on_virtual_time, fail_next, Actor};
//! use poolgate_actors::{Gate, GateSettings};
//! use std::time::Duration;
//!
//! on_virtual_time(async {
//!     let node = NodeId::new("n1").unwrap();
//!     let pool = PoolDefinition::new(PoolId::new("p").unwrap(), vec![node.clone()]).unwrap();
//!     let policy = PlanningPolicy { on_readiness_lost: OnReadinessLost::Wait, wait_timeout: None };
//!     let gate = Gate::start(GateSettings::new(pool, Duration::from_secs(5), policy).unwrap());
//!     make_ready(&gate, &node, b"n1's key").await.unwrap();
//!     advance_by(Duration::from_secs(5)).await; // the window, in no real time
//!     let ready = gate.wait_ready().await.unwrap();
//!     // The node's actor fails on its next message: restarted empty,
//!     // the node is not ready until it reports again.
//!     fail_next(&gate, Actor::Node(node.clone()));
//!     make_ready(&gate, &node, b"n1's key").await.unwrap();
//!     assert!(gate.report().await.unwrap().run.is_none());
//!     # let _ = ready;
//! });
//! ```

use std::future::Future;
use std::time::Duration;

use crate::error::GateError;
use crate::gate::Gate;
use poolgate_core::{AgentReport, MembershipUpdate, NodeId, RegistryFact, SwimState};

/// Runs `test` in an actix `System` on tokio's paused clock: time moves
/// only when every task waits, straight to the next timer, so a window of
/// minutes takes no real time and every run is the same.
pub fn on_virtual_time<F: Future<Output = ()>>(test: F) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap_or_else(|e| panic!("a current-thread runtime: {e}"));
    actix::System::with_tokio_rt(move || runtime).block_on(test);
}

/// Lets `span` of virtual time pass (every timer due meanwhile fires, in
/// order).
pub async fn advance_by(span: Duration) {
    tokio::time::sleep(span).await;
}

/// Scripts a node to ready: known to the registry, alive in SWIM (at
/// incarnation 1), available, with `identity` as its identity material.
pub async fn make_ready(gate: &Gate, node: &NodeId, identity: &[u8]) -> Result<(), GateError> {
    gate.registry(RegistryFact::Known { node: node.clone() })
        .await?;
    gate.membership(MembershipUpdate {
        node: node.clone(),
        state: SwimState::Alive,
        incarnation: 1,
    })
    .await?;
    gate.agent(AgentReport::Available { node: node.clone() })
        .await?;
    gate.identity(node.clone(), identity.to_vec()).await?;
    Ok(())
}

/// As [`make_ready`], through a fleet: the node is ready in every pool
/// that has it.
pub async fn make_ready_in(
    fleet: &crate::Fleet,
    node: &NodeId,
    identity: &[u8],
) -> Result<(), GateError> {
    fleet
        .registry(RegistryFact::Known { node: node.clone() })
        .await?;
    fleet
        .membership(MembershipUpdate {
            node: node.clone(),
            state: SwimState::Alive,
            incarnation: 1,
        })
        .await?;
    fleet
        .agent(AgentReport::Available { node: node.clone() })
        .await?;
    fleet
        .agent(AgentReport::identity(node.clone(), identity.to_vec())?)
        .await?;
    Ok(())
}

/// One of the gate's actors.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Actor {
    /// The pool actor: restarted by its supervisor, readiness starts over
    /// (a fresh window, a new epoch).
    Pool,
    /// A candidate's node actor: restarted with no facts; a committed run
    /// that requires the node faults `internal`.
    Node(NodeId),
    /// The committed run's actor: its run faults `internal` at its next
    /// message.
    Run,
}

/// Makes `actor` fail (panic) on its next message, as a failure of its
/// own or of a hook it runs would. Nothing happens if there is no such
/// actor (a node that is not a candidate, no committed run).
pub fn fail_next(gate: &Gate, actor: Actor) {
    use crate::messages::{InjectFault, InjectPoolFault};
    match actor {
        Actor::Pool => gate.pool.do_send(InjectPoolFault::Panic),
        Actor::Run => gate.pool.do_send(InjectPoolFault::PanicRunActor),
        Actor::Node(node) => {
            if let Some(addr) = gate.router.route(&node) {
                addr.do_send(InjectFault::Panic);
            }
        }
    }
}
