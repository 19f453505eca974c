//! A live run recorded is replayed event for event (design §9): random inputs
//! applied to a gate on the real clock, from two feeders at once, with a
//! recording; `replay` of the recording prints exactly the events the live
//! gate published: same events, same `at_ms`, same order.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::*;
use poolgate::core::{AgentReport, Input, MembershipUpdate, RegistryFact, RunId, SwimState};
use poolgate::core::{Command, OnReadinessLost};
use poolgate::replay::{self, render::json_line, ReplayEvent};
use poolgate::{Gate, Recording};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

/// A writer into memory that the test can read back.
#[derive(Clone, Default)]
struct Shared(Arc<Mutex<Vec<u8>>>);

impl Write for Shared {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

const NODES: [&str; 3] = ["a", "b", "c"];

fn random_inputs(rng: &mut StdRng, nodes: &[&str]) -> Vec<Input> {
    let n = node(nodes[rng.random_range(0..nodes.len())]);
    if rng.random_range(0..10) < 4 {
        // Every fact that makes the node ready, at once.
        return vec![
            RegistryFact::Known { node: n.clone() }.into(),
            MembershipUpdate {
                node: n.clone(),
                state: SwimState::Alive,
                incarnation: rng.random_range(0..4),
            }
            .into(),
            AgentReport::Available { node: n.clone() }.into(),
            AgentReport::Recovered { node: n.clone() }.into(),
            AgentReport::identity(n, vec![1; 4]).unwrap().into(),
        ];
    }
    vec![match rng.random_range(0..20) {
        0..6 => MembershipUpdate {
            node: n,
            state: [
                SwimState::Alive,
                SwimState::Alive,
                SwimState::Suspect,
                SwimState::Dead,
            ][rng.random_range(0..4)],
            incarnation: rng.random_range(0..4),
        }
        .into(),
        6..8 => RegistryFact::Known { node: n }.into(),
        8 => RegistryFact::Forgotten { node: n }.into(),
        9..12 => AgentReport::Available { node: n }.into(),
        12 => AgentReport::Unavailable { node: n }.into(),
        13..15 => AgentReport::identity(n, vec![rng.random_range(1..3u8); 4])
            .unwrap()
            .into(),
        15 => AgentReport::Faulted {
            node: n,
            reason: "x".into(),
        }
        .into(),
        16 => AgentReport::Recovered { node: n }.into(),
        17 => Command::BeginPlanning {
            run: RunId::new("r").unwrap(),
            epoch: None,
        }
        .into(),
        18 => Command::CommitPlan {
            run: RunId::new("r").unwrap(),
            required: vec![n],
            epoch: None,
        }
        .into(),
        _ => Command::FinishRun {
            run: RunId::new("r").unwrap(),
        }
        .into(),
    }]
}

/// One live run: two feeders with random pauses; returns the published
/// events (JSON lines) and the recording.
/// A live run fed `random_inputs` from two tasks; with `batched`, the
/// facts of one node that come together go as one input (`observe_all`,
/// as an agent frame does).
fn live_run(seed: u64, batched: bool) -> (Vec<String>, Vec<u8>) {
    let recorded = Shared::default();
    let mut settings = config(&NODES, 40, OnReadinessLost::Wait, Some(90))
        .gate_settings()
        .unwrap();
    settings.record = Some(Recording::new(Box::new(recorded.clone())));
    let events = actix::System::new().block_on(async move {
        let gate = Gate::start(settings);
        let mut events = gate.subscribe();
        let feeder = |gate: Gate, seed: u64, nodes: &'static [&'static str]| async move {
            let mut rng = StdRng::seed_from_u64(seed);
            for _ in 0..50 {
                let pause = if rng.random_range(0..10) < 7 {
                    rng.random_range(0..5u64)
                } else {
                    rng.random_range(30..80u64)
                };
                tokio::time::sleep(Duration::from_millis(pause)).await;
                let inputs = random_inputs(&mut rng, nodes);
                if batched && inputs.len() > 1 {
                    let mut node = None;
                    let observations = inputs
                        .into_iter()
                        .filter_map(|input| match input {
                            Input::Observation {
                                node: n,
                                observation,
                            } => {
                                node = Some(n);
                                Some(observation)
                            }
                            Input::Command(_) => None,
                        })
                        .collect();
                    if let Some(node) = node {
                        let _ = gate.observe_all(node, observations).await;
                    }
                    continue;
                }
                for input in inputs {
                    // Refusals are part of the story; they change nothing.
                    let _ = gate.submit(gate.clock().now(), input).await;
                }
            }
        };
        let one = actix::spawn(feeder(gate.clone(), seed, &NODES[..2]));
        let two = actix::spawn(feeder(gate.clone(), seed + 1000, &NODES[1..]));
        one.await.unwrap();
        two.await.unwrap();
        // Let every pending timer fire.
        while let Some(deadline) = gate.pending_deadline().await.unwrap() {
            tokio::time::sleep_until(gate.clock().instant(deadline) + Duration::from_millis(2))
                .await;
        }
        drain(&mut events)
            .into_iter()
            .map(|e| json_line(&ReplayEvent::Gate(e)))
            .collect::<Vec<_>>()
    });
    let recording = recorded.0.lock().unwrap().clone();
    (events, recording)
}

#[test]
fn random_live_runs_replay_from_their_recordings_event_for_event() {
    let config = config(&NODES, 40, OnReadinessLost::Wait, Some(90));
    let mut compared = 0;
    let mut ready = 0;
    // Half the runs send the facts that come together as one input, as an
    // agent frame does (`Gate::observe_all`).
    for (seed, batched) in (0..12).map(|seed| (seed, seed % 2 == 1)) {
        let (live, recording) = live_run(seed, batched);
        let mut replayed = Vec::new();
        replay::run(&config, &recording[..], |event| {
            replayed.push(json_line(event));
            Ok(())
        })
        .unwrap();
        assert_eq!(
            live,
            replayed,
            "seed {seed}; recording:\n{}",
            String::from_utf8_lossy(&recording)
        );
        compared += live.len();
        ready += live.iter().filter(|l| l.contains("\"pool_ready\"")).count();
    }
    assert!(
        compared >= 10 && ready >= 2,
        "the runs published events ({compared}, {ready} PoolReady)"
    );
}

#[test]
fn the_live_demo_recorded_replays_to_the_same_events() {
    let dir = std::env::temp_dir().join(format!("poolgate-record-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let record = dir.join("demo.jsonl");
    // From a folder with no config.toml: the demo runs on the shipped
    // one, built in (it failed: "config.toml: No such file or directory").
    let demo = std::process::Command::new(env!("CARGO_BIN_EXE_poolgate"))
        .args(["demo", "--json", "--seed", "3", "--record"])
        .arg(&record)
        .current_dir(&dir)
        .output()
        .unwrap();
    assert_eq!(demo.status.code(), Some(0));
    let live: Vec<String> = String::from_utf8(demo.stdout)
        .unwrap()
        .lines()
        .filter(|l| !l.contains("\"node_crashed\""))
        .map(str::to_string)
        .collect();
    let replay = std::process::Command::new(env!("CARGO_BIN_EXE_poolgate"))
        .arg("replay")
        .arg(&record)
        .arg("--config")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/config.toml"))
        .output()
        .unwrap();
    assert_eq!(
        replay.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&replay.stderr)
    );
    let replayed: Vec<String> = String::from_utf8(replay.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(live, replayed);
    let text = std::fs::read_to_string(&record).unwrap();
    assert!(text.lines().next().unwrap().contains("\"settings\""));
    assert!(
        !text.contains("material"),
        "identity recorded as fingerprints only"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
