//! Flood: a million observations pushed as fast as the API takes them into
//! a 10,000-node pool. Memory stays bounded (each producer has one
//! observation in flight; a node's state is one set of facts however many
//! observations it gets) and no transition is lost: every node's final
//! readiness equals an independent fold of the same stream.
//!
//! `POOLGATE_FLOOD` sets the number of observations (default 1,000,000).
//! Alone in its file so the peak memory read from /proc is this test's.

use std::collections::HashMap;

mod common;

use common::on_virtual_time;
use poolgate::core::{AgentReport, Input, MembershipUpdate, Observation, RegistryFact};
use poolgate::Gate;
use poolgate::GateSettings;
use poolgate_actors::core::{NodeId, OnReadinessLost, PoolDefinition, PoolId, SwimState};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

const NODES: usize = 10_000;
const PRODUCERS: usize = 32;

/// The facts the fold keeps per node: known, SWIM (state, incarnation),
/// available, identity, faulted.
#[derive(Default, Clone)]
struct Fold {
    known: bool,
    swim: Option<(SwimState, u64)>,
    available: bool,
    identity: bool,
    faulted: bool,
}

impl Fold {
    fn apply(&mut self, input: &Input) {
        let Input::Observation { observation, .. } = input else {
            unreachable!("the flood has observations only");
        };
        match observation {
            Observation::Known => self.known = true,
            Observation::Forgotten => {
                self.known = false;
                self.identity = false;
            }
            Observation::Swim { state, incarnation } => {
                let (state, j) = (*state, *incarnation);
                let admitted = match self.swim {
                    None => state != SwimState::Suspect,
                    Some((s, i)) => match state {
                        SwimState::Alive => j > i,
                        SwimState::Suspect => {
                            j >= i && (s == SwimState::Alive || (s == SwimState::Suspect && j > i))
                        }
                        _ => {
                            let down = matches!(s, SwimState::Dead | SwimState::Left);
                            j >= i && !(down && i >= j)
                        }
                    },
                };
                if admitted {
                    self.swim = Some((state, j));
                }
            }
            Observation::Available => self.available = true,
            Observation::Unavailable => self.available = false,
            Observation::Identity(_) => self.identity = true,
            Observation::Faulted { .. } => {
                self.faulted = true;
                self.available = false;
            }
            Observation::Recovered => self.faulted = false,
        }
    }

    fn ready(&self) -> bool {
        self.known
            && matches!(self.swim, Some((SwimState::Alive, _)))
            && self.available
            && self.identity
            && !self.faulted
    }
}

fn observation(rng: &mut StdRng, node: NodeId, keys: &[Vec<u8>]) -> Input {
    match rng.random_range(0..100) {
        0..45 => {
            let state = match rng.random_range(0..10) {
                0..7 => SwimState::Alive,
                7..9 => SwimState::Suspect,
                _ => SwimState::Dead,
            };
            Input::from(MembershipUpdate {
                node,
                state,
                incarnation: rng.random_range(0..6),
            })
        }
        45..60 => Input::from(RegistryFact::Known { node }),
        60..62 => Input::from(RegistryFact::Forgotten { node }),
        62..80 => Input::from(AgentReport::Available { node }),
        80..84 => Input::from(AgentReport::Unavailable { node }),
        84..96 => Input::from(
            AgentReport::identity(node, keys[rng.random_range(0..keys.len())].clone()).unwrap(),
        ),
        96..98 => Input::from(AgentReport::Faulted {
            node,
            reason: "flood".into(),
        }),
        _ => Input::from(AgentReport::Recovered { node }),
    }
}

fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

#[test]
fn a_million_observations_into_ten_thousand_nodes_lose_no_transition() {
    let total: usize = std::env::var("POOLGATE_FLOOD")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let seed = 0xf100d;
    println!("flood: {total} observations, {NODES} candidates, seed {seed}");
    on_virtual_time(async move {
        let names: Vec<NodeId> = (0..NODES + NODES / 10)
            .map(|i| NodeId::new(&format!("n{i}")).unwrap())
            .collect();
        let definition =
            PoolDefinition::new(PoolId::new("flood").unwrap(), names[..NODES].to_vec()).unwrap();
        let policy = poolgate_actors::core::PlanningPolicy {
            on_readiness_lost: OnReadinessLost::Wait,
            wait_timeout: None,
        };
        let settings =
            GateSettings::new(definition, std::time::Duration::from_secs(5), policy).unwrap();
        let gate = Gate::start(settings);
        let keys: Vec<Vec<u8>> = (0..4).map(|k| vec![k as u8 + 1; 32]).collect();
        let rss_before = peak_rss_kib();
        // Each producer owns a share of the nodes, so each node's stream
        // keeps its order; every producer has one observation in flight.
        let mut producers = Vec::new();
        for p in 0..PRODUCERS {
            let gate = gate.clone();
            let names = names.clone();
            let keys = keys.clone();
            producers.push(actix::spawn(async move {
                let mut rng = StdRng::seed_from_u64(seed + p as u64);
                let mine: Vec<&NodeId> = names.iter().skip(p).step_by(PRODUCERS).collect();
                let mut folds: HashMap<NodeId, Fold> = HashMap::new();
                for _ in 0..total / PRODUCERS {
                    let node = mine[rng.random_range(0..mine.len())].clone();
                    let input = observation(&mut rng, node.clone(), &keys);
                    folds.entry(node).or_default().apply(&input);
                    gate.submit(gate.clock().now(), input).await.unwrap();
                }
                folds
            }));
        }
        let mut expected: HashMap<NodeId, Fold> = HashMap::new();
        for producer in producers {
            expected.extend(producer.await.unwrap());
        }
        let report = gate.report().await.unwrap();
        let peak = peak_rss_kib();
        println!("peak RSS {peak} KiB (before the flood {rss_before} KiB)");
        assert_eq!(report.candidates.len(), NODES);
        let mut ready = 0;
        for candidate in &report.candidates {
            let want = expected
                .get(&candidate.node)
                .map(Fold::ready)
                .unwrap_or(false);
            assert_eq!(candidate.verdict.is_ready(), want, "{}", candidate.node);
            ready += usize::from(want);
        }
        println!("{ready} of {NODES} candidates ready at the end");
        assert!(
            report.ignored_non_candidate > 0,
            "the stream had non-candidates"
        );
        assert!(peak < 64 * 1024, "peak RSS {peak} KiB");
    });
}
