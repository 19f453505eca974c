//! How an orchestrator embeds the gate: start it inside its actix `System`,
//! feed it the three kinds of input, wait for readiness, plan, commit, and
//! react to a fault. Runs on the real clock in about a second:
//!
//! ```text
//! cargo run --example embed
//! ```

use std::time::Duration;

use poolgate::core::{AgentReport, MembershipUpdate, RegistryFact};
use poolgate::core::{
    Event, NodeId, OnReadinessLost, PlanningPolicy, PoolDefinition, PoolId, RunId, SwimState,
};
use poolgate::GateSettings;
use poolgate::{Gate, GateError};

#[actix_rt::main]
async fn main() -> Result<(), GateError> {
    let members: Vec<NodeId> = ["gpu-0", "gpu-1", "gpu-2"]
        .into_iter()
        .map(NodeId::new)
        .collect::<Result<_, _>>()?;
    let definition = PoolDefinition::new(PoolId::new("training")?, members.clone())?;
    let policy = PlanningPolicy {
        on_readiness_lost: OnReadinessLost::Wait,
        wait_timeout: Some(Duration::from_secs(5)),
    };
    // Checked as config.toml is: a wait timeout not longer than the
    // window, say, is an error here.
    let settings = GateSettings::new(definition, Duration::from_millis(300), policy)?;
    let gate = Gate::try_start(settings)?;
    let mut events = gate.subscribe();

    // Three inputs, three types: the registry, SWIM, and the node agents.
    for node in &members {
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
        let key = format!("public key of {node}").into_bytes();
        gate.agent(AgentReport::identity(node.clone(), key)?)
            .await?;
    }

    let report = gate.report().await?;
    println!("before the window: {:?}", report.phase);

    let ready = gate.wait_ready().await?;
    println!("pool {} ready, epoch {}", ready.pool, ready.epoch);

    let run = RunId::new("run-42")?;
    gate.begin_planning(run.clone(), Some(ready.epoch)).await?;
    // The plan itself is the orchestrator's business; the gate only fences it.
    gate.commit_plan(run.clone(), members[..2].to_vec(), Some(ready.epoch))
        .await?;

    // SWIM suspects a required node: the run faults at once.
    gate.membership(MembershipUpdate {
        node: members[1].clone(),
        state: SwimState::Suspect,
        incarnation: 1,
    })
    .await?;

    while let Some(event) = events.recv().await {
        println!(
            "event: {}",
            serde_json::to_string(&event).unwrap_or_default()
        );
        if let Event::RunFaulted { node, reason, .. } = event {
            println!("run {run} faulted: {node} is {reason}; not re-placed (MVP)");
            break;
        }
    }
    actix_rt::System::current().stop();
    Ok(())
}
