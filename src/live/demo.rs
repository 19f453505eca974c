//! The live demo (`cargo run`, `poolgate demo`): a real SWIM cluster on
//! 127.0.0.1 feeding the gate.
//!
//! [`LiveCluster`] starts the orchestrator's SWIM member (its membership
//! feeds the gate) and one SWIM member per node, each on an ephemeral UDP
//! port, plus a small in-process agent per node that registers it and,
//! after a random delay, announces `NodeAvailable` and a random 32-byte
//! identity key. [`run`] tells the story: the pool forms, `PoolReady`, a
//! planner plans and commits a run requiring some nodes, one required
//! node's SWIM member crashes (its socket stops answering), and the run
//! faults on suspicion.

use std::net::SocketAddr;
use std::time::Duration;

use actix::Addr;
use poolgate_actors::core::{
    AgentReport, Event, NodeId, PoolDefinition, PoolPhase, PoolReport, RegistryFact, RunId, Time,
};
use poolgate_actors::{Gate, GateError, GateSettings};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde::Serialize;

use crate::config::Config;
use crate::live::swim::member::{Crash, Join, Leave};
use crate::live::swim::SwimMember;
use crate::live::wire::Keyring;
use crate::replay::{explain, render};

/// Why the demo could not run.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// A socket could not be bound.
    #[error("cannot start a SWIM member: {0}")]
    Bind(#[from] std::io::Error),
    /// The gate refused something it should not have.
    #[error(transparent)]
    Gate(#[from] GateError),
    /// The story did not finish in time.
    #[error("the demo did not finish within {0:?}")]
    Timeout(Duration),
}

/// A SWIM cluster on loopback whose orchestrator member feeds a gate.
pub struct LiveCluster {
    /// The gate, fed by the orchestrator's SWIM member.
    pub gate: Gate,
    /// The orchestrator's SWIM member and its address.
    pub orchestrator: (Addr<SwimMember>, SocketAddr),
    /// Each node's id and SWIM member.
    pub nodes: Vec<(NodeId, Addr<SwimMember>)>,
    rng: StdRng,
}

impl LiveCluster {
    /// Starts the gate over `config.demo.nodes` nodes (`node-1` …) and their
    /// SWIM members. Must be called inside a running actix `System`.
    pub async fn start(config: &Config, seed: u64) -> Result<LiveCluster, DemoError> {
        let mut rng = StdRng::seed_from_u64(seed);
        let names: Vec<NodeId> = (1..=config.demo.nodes)
            .map(|i| NodeId::new(&format!("node-{i}")))
            .collect::<Result<_, _>>()
            .map_err(GateError::from)?;
        let definition = PoolDefinition::new(config.pool.id().clone(), names.clone())
            .map_err(GateError::from)?;
        let gate = Gate::start(GateSettings {
            definition,
            window: config.convergence_window,
            policy: config.planning,
        });
        let foca_config = config.swim.timings.foca_config(config.demo.nodes + 1);

        let feed = gate.clone();
        let sink = Box::new(move |update| feed.membership_nowait(update));
        let orchestrator = SwimMember::start(
            "orchestrator",
            config.swim.bind,
            0,
            foca_config.clone(),
            StdRng::seed_from_u64(rng.random()),
            Some(sink),
            Keyring::new(&[], "poolgate"),
        )?;
        if !config.swim.seeds.is_empty() {
            orchestrator.0.do_send(Join {
                seeds: config.swim.seeds.clone(),
            });
        }

        let loopback = SocketAddr::from(([127, 0, 0, 1], 0));
        let mut nodes = Vec::with_capacity(names.len());
        for name in names {
            let (member, _) = SwimMember::start(
                name.as_str(),
                loopback,
                0,
                foca_config.clone(),
                StdRng::seed_from_u64(rng.random()),
                None,
                Keyring::new(&[], "poolgate"),
            )?;
            member.do_send(Join {
                seeds: vec![orchestrator.1],
            });
            nodes.push((name, member));
        }
        Ok(LiveCluster {
            gate,
            orchestrator,
            nodes,
            rng,
        })
    }

    /// Starts each node's agent: it registers the node at once, then after
    /// a random delay up to `within` says `NodeAvailable` and sends a
    /// random 32-byte identity key.
    pub async fn start_agents(&mut self, within: Duration) -> Result<(), DemoError> {
        for (node, _) in &self.nodes {
            self.gate
                .registry(RegistryFact::Known { node: node.clone() })
                .await?;
            let delay = Duration::from_millis(
                self.rng
                    .random_range(0..=u64::try_from(within.as_millis()).unwrap_or(u64::MAX)),
            );
            let key: [u8; 32] = self.rng.random();
            let gate = self.gate.clone();
            let node = node.clone();
            actix::spawn(async move {
                tokio::time::sleep(delay).await;
                // The gate outlives its agents in the demo; a refusal here
                // would only mean the system is stopping.
                if gate
                    .agent(AgentReport::Available { node: node.clone() })
                    .await
                    .is_ok()
                {
                    if let Ok(identity) = AgentReport::identity(node, key.to_vec()) {
                        let _ = gate.agent(identity).await;
                    }
                }
            });
        }
        Ok(())
    }

    /// The SWIM member of `node`.
    pub fn member(&self, node: &NodeId) -> Option<&Addr<SwimMember>> {
        self.nodes.iter().find(|(n, _)| n == node).map(|(_, m)| m)
    }

    /// Crashes `node`'s SWIM member: its socket stops answering.
    pub fn crash(&self, node: &NodeId) {
        if let Some(member) = self.member(node) {
            member.do_send(Crash);
        }
    }

    /// `node`'s SWIM member leaves the cluster gracefully.
    pub fn leave(&self, node: &NodeId) {
        if let Some(member) = self.member(node) {
            member.do_send(Leave);
        }
    }

    /// Stops every SWIM member.
    pub fn shut_down(&self) {
        self.orchestrator.0.do_send(Crash);
        for (_, member) in &self.nodes {
            member.do_send(Crash);
        }
    }
}

/// One line of the demo's output.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum DemoLine {
    /// A gate event.
    Event(Event),
    /// The demo crashed a node's SWIM member.
    Crashed(NodeCrashed),
    /// A remark for a person (what the pool waits for); not in JSON.
    #[serde(skip)]
    Note {
        /// The instant it happened on the gate's timeline (`at_ms`).
        at: Time,
        /// The remark.
        text: String,
    },
}

impl DemoLine {
    /// The line as printed: a JSON object (`json`), or readable text.
    /// Notes are for people only: `None` in JSON.
    pub fn render(&self, json: bool) -> Option<String> {
        let text = match (self, json) {
            (DemoLine::Note { .. }, true) => return None,
            (DemoLine::Note { at, text }, false) => render::timed(*at, &format!("· {text}")),
            (DemoLine::Event(event), false) => {
                render::timed(event.at(), &render::describe_event(event))
            }
            (DemoLine::Crashed(crash), false) => render::timed(
                crash.at,
                &format!(
                    "demo: {}'s SWIM member crashed (its socket stops answering)",
                    crash.node
                ),
            ),
            // Serialising these types cannot fail: every map key is a string.
            (line, true) => serde_json::to_string(line).unwrap_or_default(),
        };
        Some(text)
    }
}

/// Runs the demo in a new actix `System` and prints its story on stdout:
/// readable lines with a header and a closing summary, or (`json`) one
/// JSON event per line.
pub fn print(config: &Config, json: bool, seed: u64) -> Result<DemoOutcome, DemoError> {
    if !json {
        println!(
            "poolgate live demo: {} nodes and the orchestrator on 127.0.0.1 (SWIM over UDP), window {}, seed {seed}\n",
            config.demo.nodes,
            humantime::format_duration(config.convergence_window)
        );
    }
    let system = actix::System::new();
    let outcome = system.block_on(run(config, seed, |line| {
        if let Some(text) = line.render(json) {
            println!("{text}");
        }
    }))?;
    if !json {
        println!(
            "\nPoolReady after {}; the run faulted {:.3}s after the crash.",
            outcome.ready_at,
            (outcome.faulted_at - outcome.crashed_at).as_secs_f64()
        );
    }
    Ok(outcome)
}

/// The demo's own event: it crashed a node's SWIM member.
#[derive(Debug, Clone, Serialize)]
pub struct NodeCrashed {
    /// The instant it happened on the gate's timeline (`at_ms`).
    #[serde(rename = "at_ms")]
    pub at: Time,
    event: &'static str,
    /// The node whose SWIM member was crashed.
    pub node: NodeId,
}

/// What the demo measured.
#[derive(Debug, Clone, Copy)]
pub struct DemoOutcome {
    /// When `PoolReady` first came.
    pub ready_at: Time,
    /// When the node was crashed.
    pub crashed_at: Time,
    /// When `run_faulted` came.
    pub faulted_at: Time,
}

/// Runs the story on a fresh live cluster; each line goes to `out`.
/// Must be called inside a running actix `System` (real clock).
pub async fn run(
    config: &Config,
    seed: u64,
    mut out: impl FnMut(&DemoLine),
) -> Result<DemoOutcome, DemoError> {
    const LIMIT: Duration = Duration::from_secs(60);
    let mut cluster = LiveCluster::start(config, seed).await?;
    let gate = cluster.gate.clone();
    let mut events = gate.subscribe();
    cluster.start_agents(config.demo.announce_within).await?;

    let run_id = RunId::new("run-1").map_err(GateError::from)?;
    let required: Vec<NodeId> = cluster
        .nodes
        .iter()
        .take(3)
        .map(|(n, _)| n.clone())
        .collect();
    let victim = required.get(1).unwrap_or(&required[0]).clone();

    let give_up = tokio::time::sleep(LIMIT);
    tokio::pin!(give_up);
    let mut ticker = tokio::time::interval(Duration::from_millis(250));
    let mut crash_at: Option<tokio::time::Instant> = None;
    let mut ready_at = None;
    let mut crashed_at = None;
    let mut last_note = String::new();

    let outcome = loop {
        let crash_timer = async {
            match crash_at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = &mut give_up => break Err(DemoError::Timeout(LIMIT)),
            _ = crash_timer => {
                crash_at = None;
                cluster.crash(&victim);
                let at = gate.clock().now();
                crashed_at = Some(at);
                out(&DemoLine::Crashed(NodeCrashed { at, event: "node_crashed", node: victim.clone() }));
            }
            _ = ticker.tick(), if ready_at.is_none() => {
                let report = gate.report().await?;
                let note = waiting_for(&report, gate.clock().now());
                if note != last_note {
                    out(&DemoLine::Note { at: gate.clock().now(), text: note.clone() });
                    last_note = note;
                }
            }
            event = events.recv() => {
                let Some(event) = event else { break Err(DemoError::Gate(GateError::Stopped)) };
                out(&DemoLine::Event(event.clone()));
                match event {
                    Event::PoolReady { epoch, at, .. } if ready_at.is_none() => {
                        ready_at = Some(at);
                        gate.begin_planning(run_id.clone(), Some(epoch)).await?;
                        gate.commit_plan(run_id.clone(), required.clone(), Some(epoch)).await?;
                        crash_at = Some(tokio::time::Instant::now() + config.demo.crash_after);
                    }
                    Event::RunFaulted { at, .. } => {
                        break match (ready_at, crashed_at) {
                            (Some(ready_at), Some(crashed_at)) => Ok(DemoOutcome { ready_at, crashed_at, faulted_at: at }),
                            _ => Err(DemoError::Gate(GateError::Stopped)),
                        };
                    }
                    _ => {}
                }
            }
        }
    };
    cluster.shut_down();
    outcome
}

/// What the pool is waiting for, from the readiness report: the blockers
/// as `--explain` words them, or the window's countdown.
fn waiting_for(report: &PoolReport, now: Time) -> String {
    match report.phase {
        PoolPhase::Converging { deadline } => format!(
            "every node ready; the view must hold still: PoolReady in {:.0}s",
            (deadline - now).as_secs_f64().ceil()
        ),
        _ => explain::state_line(report),
    }
}
