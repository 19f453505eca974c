//! The live demo (`cargo run`, `poolgate demo`): a real cluster on
//! 127.0.0.1, told as a story.
//!
//! It writes keys and configurations to a temporary folder, starts the
//! orchestrator in this process and one `poolgate node` process per node
//! (the same binary), each after a short random delay. The pool forms,
//! `PoolReady`, a planner plans and commits a run requiring some nodes,
//! the demo SIGKILLs one required node's process, and the run faults. Every
//! node process is reaped on the way out, on error or Ctrl-C too.

use std::path::PathBuf;
use std::time::Duration;

use poolgate_actors::core::{Event, NodeId, PoolPhase, PoolReport, RunId, Time};
use poolgate_actors::GateError;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde::Serialize;

use crate::cli::cluster::{ClusterPlan, LocalCluster};
use crate::config::Config;
use crate::live::LiveError;
use crate::replay::{explain, render};

/// Why the demo could not run.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// The cluster could not start.
    #[error(transparent)]
    Live(#[from] LiveError),
    /// The gate refused something it should not have.
    #[error(transparent)]
    Gate(#[from] GateError),
    /// The story did not finish in time.
    #[error("the demo did not finish within {0:?}")]
    Timeout(Duration),
    /// Ctrl-C or SIGTERM.
    #[error("interrupted")]
    Interrupted,
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
                &format!("demo: SIGKILL to {}'s node process", crash.node),
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
pub fn print(
    config: &Config,
    json: bool,
    nodes: Option<u32>,
    seed: u64,
    record: Option<poolgate_actors::Recording>,
) -> Result<DemoOutcome, DemoError> {
    let mut config = config.clone();
    // The demo is a show of its own, in memory: its orchestrator neither
    // reads nor writes the configuration's state file.
    config.state.path = None;
    if let Some(nodes) = nodes {
        config.demo.nodes = nodes.clamp(1, 64);
    }
    if !json {
        println!(
            "poolgate live demo: the orchestrator and {} node processes on 127.0.0.1 (sealed SWIM over UDP, signed announcements over TCP), window {}, seed {seed}\n",
            config.demo.nodes,
            crate::config::in_words(config.convergence_window)
        );
    }
    let binary = std::env::current_exe().map_err(LiveError::Io)?;
    let system = actix::System::new();
    let outcome = system.block_on(run(&config, binary, seed, record, |line| {
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

/// Runs the story on a fresh local cluster of `binary`'s node processes;
/// each line goes to `out`. Must be called inside a running actix
/// `System` (real clock).
pub async fn run(
    config: &Config,
    binary: PathBuf,
    seed: u64,
    record: Option<poolgate_actors::Recording>,
    mut out: impl FnMut(&DemoLine),
) -> Result<DemoOutcome, DemoError> {
    const LIMIT: Duration = Duration::from_secs(60);
    let plan = ClusterPlan {
        binary,
        nodes: config.demo.nodes,
        base: config.clone(),
        seed,
        health_check: None,
        health_interval: Duration::from_secs(5),
        external_orchestrator: false,
        node_log: None,
        insecure: false,
        record,
    };
    let mut cluster = LocalCluster::prepare(&plan).await?;
    let gate = cluster
        .orchestrator()
        .ok_or(LiveError::Io(std::io::Error::other("no orchestrator")))?
        .gate
        .clone();
    let mut events = gate.subscribe();
    let mut rng = StdRng::seed_from_u64(seed);
    let within = u64::try_from(config.demo.announce_within.as_millis()).unwrap_or(u64::MAX);
    let mut starts: Vec<(u64, usize)> = (0..cluster.nodes.len())
        .map(|i| (rng.random_range(0..=within), i))
        .collect();
    starts.sort();

    let run_id = RunId::new("run-1").map_err(GateError::from)?;
    let required: Vec<NodeId> = cluster
        .nodes
        .iter()
        .take(3)
        .map(|n| n.name.clone())
        .collect();
    let victim = required.get(1).unwrap_or(&required[0]).clone();

    let give_up = tokio::time::sleep(LIMIT);
    tokio::pin!(give_up);
    let interrupted = tokio::signal::ctrl_c();
    tokio::pin!(interrupted);
    let mut ticker = tokio::time::interval(Duration::from_millis(250));
    let started = tokio::time::Instant::now();
    let mut crash_at: Option<tokio::time::Instant> = None;
    let mut ready_at = None;
    let mut crashed_at = None;
    let mut last_note = String::new();

    loop {
        // Start the node processes whose random delay has passed.
        while let Some(&(delay, i)) = starts.first() {
            if started.elapsed() < Duration::from_millis(delay) {
                break;
            }
            starts.remove(0);
            cluster.spawn(i)?;
        }
        let next_start = starts
            .first()
            .map(|(delay, _)| started + Duration::from_millis(*delay));
        let wake = async {
            match (crash_at, next_start) {
                (Some(at), _) | (None, Some(at)) => tokio::time::sleep_until(at).await,
                (None, None) => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = &mut give_up => return Err(DemoError::Timeout(LIMIT)),
            _ = &mut interrupted => return Err(DemoError::Interrupted),
            _ = wake => {
                if crash_at.is_some_and(|at| at <= tokio::time::Instant::now()) {
                    crash_at = None;
                    if let Some(i) = cluster.index(&victim) {
                        cluster.kill(i);
                    }
                    let at = gate.clock().now();
                    crashed_at = Some(at);
                    out(&DemoLine::Crashed(NodeCrashed { at, event: "node_crashed", node: victim.clone() }));
                }
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
                let Some(event) = event else { return Err(DemoError::Gate(GateError::Stopped)) };
                out(&DemoLine::Event(event.clone()));
                match event {
                    Event::PoolReady { epoch, at, .. } if ready_at.is_none() => {
                        ready_at = Some(at);
                        gate.begin_planning(run_id.clone(), Some(epoch)).await?;
                        gate.commit_plan(run_id.clone(), required.clone(), Some(epoch)).await?;
                        crash_at = Some(tokio::time::Instant::now() + config.demo.crash_after);
                    }
                    Event::RunFaulted { at, .. } => {
                        return match (ready_at, crashed_at) {
                            (Some(ready_at), Some(crashed_at)) => Ok(DemoOutcome { ready_at, crashed_at, faulted_at: at }),
                            _ => Err(DemoError::Gate(GateError::Stopped)),
                        };
                    }
                    _ => {}
                }
            }
        }
    }
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
