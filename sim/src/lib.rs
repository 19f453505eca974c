//! Thousands of nodes, by simulation: a SWIM cluster in virtual time
//! feeding the real gate.
//!
//! [`net`] runs N foca members and the orchestrator's member in memory on
//! a virtual millisecond clock, over a modelled network (delay with a
//! tail, loss, partitions), with crashes and restarts. The orchestrator's
//! member goes through the shipped SWIM adapter (watching codec and
//! tracker), its facts through the orchestrator's address binding
//! (`live::nodes`), and into the real actor subsystem ([`Gate`]) on tokio's
//! paused clock, moved in step with the virtual one. Agents announce
//! themselves (available, identity material, their SWIM address) as the
//! live agent does, without the signed frame around it.
//!
//! One seed gives one run: the same events at the same instants.
//!
//! [`Simulation`] must be used inside an actix `System` whose tokio
//! runtime starts paused ([`Simulation::runtime`]).

pub mod net;
mod stats;
mod timing;

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Duration;

use poolgate_actors::core::{
    AgentReport, Epoch, Event, Input, NodeId, OnReadinessLost, PlanningPolicy, PoolDefinition,
    PoolId, RegistryFact, RunId, SwimState, Time,
};
use poolgate_actors::{EventStream, Gate, GateError, GateSettings};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use net::address;
pub use net::{node_name, Network, NetworkModel, Partition};
use poolgate::live::nodes::Nodes;
use poolgate::live::swim::SwimTimings;

/// What a simulation is made of.
#[derive(Clone, Debug)]
pub struct SimSettings {
    /// How many node members (the orchestrator's member is one more).
    pub nodes: usize,
    /// Seeds every random choice.
    pub seed: u64,
    /// The gate's convergence window.
    pub window: Duration,
    /// SWIM timings; foca's configuration is `foca_config(nodes + 1)`
    /// (foca's `Config::new_lan` for that size, with these timings).
    pub swim: SwimTimings,
    /// The network.
    pub model: NetworkModel,
    /// Each agent announces itself after a random delay below this.
    pub announce_within: Duration,
    /// Start from a converged SWIM cluster ([`Network::converge`]) instead
    /// of every member joining through the orchestrator's.
    pub converged: bool,
    /// Time the tracker for the benchmark from the first call on: the old
    /// whole-view walk beside it, member 0's input recorded for
    /// [`Network::replay_tracker`], a control call after each
    /// ([`Network::tracker_again_ns`]).
    pub time_tracker: bool,
}

impl SimSettings {
    /// `nodes` members with the shipped SWIM timings (`config.toml`:
    /// probe every 400 ms, 120 ms for a direct reply, 2 s of suspicion, 6
    /// indirect probes), a
    /// 5 s window, agents announcing within 1 s, a lossless LAN.
    pub fn new(nodes: usize, seed: u64) -> Self {
        Self {
            nodes,
            seed,
            window: Duration::from_secs(5),
            swim: SwimTimings {
                probe_period: Duration::from_millis(400),
                probe_rtt: Duration::from_millis(120),
                suspicion_timeout: Duration::from_secs(2),
                indirect_probes: poolgate::live::swim::member::DEFAULT_INDIRECT_PROBES,
            },
            model: NetworkModel::default(),
            announce_within: Duration::from_secs(1),
            converged: false,
            time_tracker: false,
        }
    }
}

/// Why a simulation could not go on.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The settings cannot make a simulation.
    #[error("invalid simulation: {0}")]
    Invalid(String),
    /// The gate refused or stopped.
    #[error(transparent)]
    Gate(#[from] GateError),
}

/// A crash and what the gate made of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Crash {
    /// The node that crashed.
    pub node: NodeId,
    /// When (virtual ms).
    pub at_ms: u64,
    /// The `run_faulted` that followed, if one did before the limit:
    /// the node it names and when.
    pub faulted: Option<(NodeId, u64)>,
}

/// A simulated cluster feeding the real gate.
pub struct Simulation {
    settings: SimSettings,
    net: Network,
    gate: Gate,
    events: EventStream,
    nodes: Nodes,
    ids: Vec<NodeId>,
    /// Agent announcements due: (virtual ms, member index).
    agents: BinaryHeap<Reverse<(u64, usize)>>,
    rng: StdRng,
    log: Vec<Event>,
    last_announce_ms: u64,
    suspicions: u64,
    epoch: Option<Epoch>,
    runs: u64,
}

impl Simulation {
    /// A tokio runtime for a simulation: current thread, clock paused.
    pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
    }

    /// Starts the gate over the pool `n1`…`nN` (all known to the
    /// registry), lets every member join through the orchestrator's, and
    /// schedules each agent's first announcement.
    pub async fn start(settings: SimSettings) -> Result<Simulation, SimError> {
        if settings.nodes == 0 || settings.nodes >= 1 << 24 {
            return Err(SimError::Invalid(format!(
                "nodes must be 1 to {}, not {}",
                (1 << 24) - 1,
                settings.nodes
            )));
        }
        if !(0.0..1.0).contains(&settings.model.loss) {
            return Err(SimError::Invalid(format!(
                "loss must be at least 0 and below 1, not {}",
                settings.model.loss
            )));
        }
        let ids = std::iter::once("orchestrator".to_string())
            .chain((1..=settings.nodes).map(node_name))
            .map(|name| NodeId::new(&name))
            .collect::<Result<Vec<_>, _>>()
            .map_err(GateError::from)?;
        let pool = PoolId::new("sim").map_err(GateError::from)?;
        let definition = PoolDefinition::new(pool, ids[1..].to_vec()).map_err(GateError::from)?;
        let policy = PlanningPolicy {
            on_readiness_lost: OnReadinessLost::Wait,
            wait_timeout: None,
        };
        let gate = Gate::try_start(GateSettings::new(definition, settings.window, policy)?)?;
        let events = gate.subscribe();
        for node in &ids[1..] {
            let known = RegistryFact::Known { node: node.clone() };
            gate.submit(Time::ZERO, known.into()).await?;
        }
        let cluster = u32::try_from(settings.nodes + 1).unwrap_or(u32::MAX);
        let config = settings.swim.foca_config(cluster);
        let mut net = Network::new(
            settings.nodes,
            config,
            settings.model.clone(),
            settings.seed,
        );
        net.time_baseline(settings.time_tracker);
        if settings.converged {
            net.converge();
        } else {
            for index in 1..=settings.nodes {
                net.join(index);
            }
        }
        let mut rng = StdRng::seed_from_u64(settings.seed ^ 0x5eed_a9e7);
        let within = u64::try_from(settings.announce_within.as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        let agents = (1..=settings.nodes)
            .map(|index| Reverse((rng.random_range(0..within), index)))
            .collect();
        Ok(Simulation {
            settings,
            net,
            gate,
            events,
            nodes: Nodes::default(),
            ids,
            agents,
            rng,
            log: Vec::new(),
            last_announce_ms: 0,
            suspicions: 0,
            epoch: None,
            runs: 0,
        })
    }

    /// The virtual instant, in milliseconds.
    pub fn now_ms(&self) -> u64 {
        self.net.now()
    }

    /// Every event the gate published so far, in order.
    pub fn events(&self) -> &[Event] {
        &self.log
    }

    /// The simulated network (counters, loss, partitions).
    pub fn network(&mut self) -> &mut Network {
        &mut self.net
    }

    /// When the last agent announcement was applied (virtual ms).
    pub fn last_announce_ms(&self) -> u64 {
        self.last_announce_ms
    }

    /// How many times the orchestrator's view turned a node suspect.
    pub fn suspicions(&self) -> u64 {
        self.suspicions
    }

    /// The node id of member `index` (1..=N).
    pub fn node(&self, index: usize) -> Option<&NodeId> {
        self.ids.get(index).filter(|_| index > 0)
    }

    /// Runs until the virtual clock reaches `until_ms` or the gate
    /// publishes an event `stop` accepts; returns that event.
    pub async fn run_until(
        &mut self,
        until_ms: u64,
        mut stop: impl FnMut(&Event) -> bool,
    ) -> Result<Option<Event>, SimError> {
        loop {
            let next = [self.net.next_at(), self.agents.peek().map(|r| r.0 .0)]
                .into_iter()
                .flatten()
                .min()
                .filter(|at| *at <= until_ms);
            let Some(next) = next else {
                self.gate_to(until_ms).await;
                self.net.advance_to(until_ms);
                return Ok(self.collect(&mut stop));
            };
            // Timers of the gate due before `next` fire first.
            if next > 0 {
                self.gate_to(next - 1).await;
                if let Some(found) = self.collect(&mut stop) {
                    return Ok(Some(found));
                }
            }
            while let Some(Reverse((at, index))) = self.agents.peek().copied() {
                if at != next {
                    break;
                }
                self.agents.pop();
                self.announce(at, index).await?;
            }
            if self.net.step(next).is_some() {
                for observed in self.net.take_observed() {
                    let suspect = observed.update.state == SwimState::Suspect;
                    let kept = self.nodes.observe(observed);
                    if suspect && kept.is_new() {
                        self.suspicions += 1;
                    }
                    if let Some(update) = kept.for_gate() {
                        self.gate
                            .submit(Time::from_millis(next), update.into())
                            .await?;
                    }
                }
            }
        }
    }

    /// Moves the gate's paused clock to `at_ms`, firing its timers due by
    /// then in order.
    async fn gate_to(&self, at_ms: u64) {
        let clock = self.gate.clock();
        let target = Time::from_millis(at_ms);
        if clock.now() < target {
            tokio::time::sleep_until(clock.instant(target)).await;
        }
    }

    fn collect(&mut self, stop: &mut impl FnMut(&Event) -> bool) -> Option<Event> {
        let mut found = None;
        while let Ok(event) = self.events.try_recv() {
            if let Event::PoolReady { epoch, .. } = &event {
                self.epoch = Some(*epoch);
            }
            if found.is_none() && stop(&event) {
                found = Some(event.clone());
            }
            self.log.push(event);
        }
        found
    }

    /// Node `index`'s agent announces itself as the live agent does: its
    /// SWIM address (bound by the orchestrator, which then announces
    /// itself to that member), no fault, its identity material, available.
    async fn announce(&mut self, at_ms: u64, index: usize) -> Result<(), SimError> {
        let Some(node) = self.node(index).cloned() else {
            return Ok(());
        };
        let at = Time::from_millis(at_ms);
        self.last_announce_ms = self.last_announce_ms.max(at_ms);
        if let Some(latest) = self.nodes.bind(&node, address(index), None) {
            self.net.announce(0, index);
            for update in latest {
                self.gate.submit(at, update.into()).await?;
            }
        }
        let material = format!("identity of {node}").into_bytes();
        let identity = AgentReport::identity(node.clone(), material).map_err(GateError::from)?;
        for report in [
            identity,
            AgentReport::Recovered { node: node.clone() },
            AgentReport::Available { node },
        ] {
            self.gate.submit(at, Input::from(report)).await?;
        }
        Ok(())
    }

    /// Runs until `PoolReady`; returns its instant, or `None` at the limit.
    pub async fn until_ready(&mut self, limit_ms: u64) -> Result<Option<u64>, SimError> {
        let ready = self
            .run_until(limit_ms, |e| matches!(e, Event::PoolReady { .. }))
            .await?;
        Ok(ready.map(|e| e.at().as_millis()))
    }

    /// Begins planning a new run on the ready pool and commits it over
    /// every candidate. Returns the run.
    pub async fn commit_all(&mut self) -> Result<RunId, SimError> {
        self.runs += 1;
        let run = RunId::new(&format!("run-{}", self.runs)).map_err(GateError::from)?;
        let at = Time::from_millis(self.now_ms());
        let epoch = self.epoch;
        self.gate
            .submit(
                at,
                Input::Command(poolgate_actors::core::Command::BeginPlanning {
                    run: run.clone(),
                    epoch,
                }),
            )
            .await?;
        self.gate
            .submit(
                at,
                Input::Command(poolgate_actors::core::Command::CommitPlan {
                    run: run.clone(),
                    required: self.ids[1..].to_vec(),
                    epoch,
                }),
            )
            .await?;
        Ok(run)
    }

    /// Crashes a random node now and runs until the committed run faults
    /// (or `limit_ms` passes); then restarts the node (a new generation)
    /// and its agent announces itself again.
    pub async fn crash_one(&mut self, limit_ms: u64) -> Result<Crash, SimError> {
        let index = self.rng.random_range(1..=self.settings.nodes);
        let node = self.ids[index].clone();
        let at_ms = self.now_ms();
        self.net.crash(index);
        let faulted = self
            .run_until(limit_ms, |e| matches!(e, Event::RunFaulted { .. }))
            .await?
            .and_then(|e| match e {
                Event::RunFaulted { node, at, .. } => Some((node, at.as_millis())),
                _ => None,
            });
        self.net.restart(index);
        let again = self.now_ms() + 50;
        self.agents.push(Reverse((again, index)));
        Ok(Crash {
            node,
            at_ms,
            faulted,
        })
    }

    /// The gate the simulation feeds.
    pub fn gate(&self) -> &Gate {
        &self.gate
    }
}
