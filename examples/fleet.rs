//! What many pools over one fleet cost (design §14), on the real clock,
//! side by side in one run:
//!
//! - 1,000 nodes in 100 pools of 10, and in 10 pools of 100: the heap and
//!   CPU of one `Fleet` fed every fact once, against as many separate
//!   `Gate`s each fed the facts of its own members;
//! - the cost of one SWIM observation as the number of pools holding its
//!   node grows (1, 10, 100), and as the fleet grows around it;
//! - the time from a required node's loss to `run_faulted` for a run in
//!   one of 100 pools, against a lone gate's.
//!
//! ```text
//! cargo run --release --example fleet -- --json
//! ```

use std::time::{Duration, Instant};

use poolgate::core::{
    Event, IdentityMaterial, MembershipUpdate, NodeId, Observation, OnReadinessLost,
    PlanningPolicy, PoolDefinition, PoolId, RegistryFact, RunId, SwimState,
};
use poolgate::{EventStream, Fleet, Gate, GateSettings};

#[path = "common/counting.rs"]
mod counting;
use counting::{cpu_ms, live, Counting};

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const WINDOW: Duration = Duration::from_millis(20);

fn node(i: usize) -> NodeId {
    NodeId::new(&format!("node-{i}")).expect("a valid id")
}

fn settings(id: &str, members: Vec<NodeId>) -> GateSettings {
    let definition =
        PoolDefinition::new(PoolId::new(id).expect("a valid id"), members).expect("a valid pool");
    let policy = PlanningPolicy {
        on_readiness_lost: OnReadinessLost::Wait,
        wait_timeout: None,
    };
    GateSettings::new(definition, WINDOW, policy).expect("valid settings")
}

/// `pools` pools of `size` nodes over nodes `0..pools*size`, in order.
fn layout(pools: usize, size: usize) -> Vec<GateSettings> {
    (0..pools)
        .map(|p| {
            settings(
                &format!("pool-{p}"),
                (p * size..(p + 1) * size).map(node).collect(),
            )
        })
        .collect()
}

/// What makes a node ready, as one agent frame says it.
fn ready_facts(n: &NodeId) -> Vec<Observation> {
    let identity = IdentityMaterial::new(n.as_str().as_bytes().to_vec()).expect("identity");
    vec![
        Observation::Known,
        Observation::Swim {
            state: SwimState::Alive,
            incarnation: 1,
        },
        Observation::Available,
        Observation::Identity(identity.fingerprint()),
    ]
}

struct Footprint {
    heap: isize,
    cpu_ms: f64,
    wall_ms: f64,
}

/// One fleet over `pools`, every node's facts fed once, to ready.
async fn fleet_footprint(pools: Vec<GateSettings>) -> Footprint {
    let (before, cpu, began) = (live(), cpu_ms(), Instant::now());
    let nodes: Vec<NodeId> = pools
        .iter()
        .flat_map(|p| p.definition.members().to_vec())
        .collect();
    let ids: Vec<PoolId> = pools.iter().map(|p| p.definition.id().clone()).collect();
    let fleet = Fleet::try_start(pools).expect("a fleet");
    for n in &nodes {
        fleet
            .observe_all(n.clone(), ready_facts(n))
            .await
            .expect("taken");
    }
    for id in &ids {
        fleet
            .pool(id)
            .expect("a pool")
            .wait_ready()
            .await
            .expect("ready");
    }
    let footprint = Footprint {
        heap: live() - before,
        cpu_ms: cpu_ms() - cpu,
        wall_ms: began.elapsed().as_secs_f64() * 1e3,
    };
    let probes: Vec<_> = ids
        .iter()
        .filter_map(|id| fleet.pool(id))
        .map(|gate| gate.actor_probe())
        .collect();
    fleet.stop();
    drop(fleet);
    gone(probes).await;
    footprint
}

/// Waits until every actor the probes count has stopped.
async fn gone(probes: Vec<impl Fn() -> usize>) {
    let mut turns = 0;
    while probes.iter().any(|probe| probe() > 0) {
        turns += 1;
        assert!(turns < 1_000_000, "actors outlived their gates");
        tokio::task::yield_now().await;
    }
}

/// Separate gates over `pools`, each fed its own members' facts, to ready.
async fn gates_footprint(pools: Vec<GateSettings>) -> Footprint {
    let (before, cpu, began) = (live(), cpu_ms(), Instant::now());
    let mut gates = Vec::new();
    for settings in pools {
        let members = settings.definition.members().to_vec();
        let gate = Gate::start(settings);
        for n in &members {
            gate.registry(RegistryFact::Known { node: n.clone() })
                .await
                .expect("taken");
            gate.observe_all(n.clone(), ready_facts(n)[1..].to_vec())
                .await
                .expect("taken");
        }
        gates.push(gate);
    }
    for gate in &gates {
        gate.wait_ready().await.expect("ready");
    }
    let footprint = Footprint {
        heap: live() - before,
        cpu_ms: cpu_ms() - cpu,
        wall_ms: began.elapsed().as_secs_f64() * 1e3,
    };
    let probes: Vec<_> = gates.iter().map(|gate| gate.actor_probe()).collect();
    for gate in &gates {
        gate.stop();
    }
    drop(gates);
    gone(probes).await;
    footprint
}

/// `side` over `layout(pools, size)` `times` times: the median heap held
/// at ready, and the mean CPU and wall time of one.
async fn repeated<F, Fut>(side: F, pools: usize, size: usize, times: usize) -> Footprint
where
    F: Fn(Vec<GateSettings>) -> Fut,
    Fut: std::future::Future<Output = Footprint>,
{
    let mut heaps = Vec::with_capacity(times);
    let (mut cpu, mut wall) = (0.0, 0.0);
    for _ in 0..times {
        let once = side(layout(pools, size)).await;
        heaps.push(once.heap);
        cpu += once.cpu_ms;
        wall += once.wall_ms;
    }
    heaps.sort();
    Footprint {
        heap: heaps[times / 2],
        cpu_ms: cpu / times as f64,
        wall_ms: wall / times as f64,
    }
}

/// The mean cost in µs of one SWIM observation of a node `holders` of the
/// fleet's `pools` pools (of 10 nodes each) hold.
async fn observation_cost(pools: usize, holders: usize, rounds: u64) -> f64 {
    let hot = NodeId::new("hot").expect("a valid id");
    let settings: Vec<GateSettings> = (0..pools)
        .map(|p| {
            let mut members: Vec<NodeId> = (p * 9..(p + 1) * 9).map(node).collect();
            if p < holders {
                members.push(hot.clone());
            }
            settings(&format!("pool-{p}"), members)
        })
        .collect();
    let fleet = Fleet::try_start(settings).expect("a fleet");
    fleet
        .observe_all(hot.clone(), ready_facts(&hot))
        .await
        .expect("taken");
    let began = Instant::now();
    for incarnation in 2..2 + rounds {
        let update = MembershipUpdate {
            node: hot.clone(),
            state: SwimState::Alive,
            incarnation,
        };
        fleet.membership(update).await.expect("taken");
    }
    let cost = began.elapsed().as_secs_f64() * 1e6 / rounds as f64;
    fleet.stop();
    cost
}

/// Waits for `run`'s fault on `events`.
async fn faulted(events: &mut EventStream, run: &RunId) {
    while let Some(event) = events.recv().await {
        if matches!(&event, Event::RunFaulted { run: r, .. } if r == run) {
            return;
        }
    }
    panic!("the stream ended before the fault");
}

/// From a required node's death to `run_faulted`, in µs, for a run in a
/// pool of 10: in one of 100 pools of a fleet (`fleet`), or in a lone gate.
async fn fault_latency(fleet_of: usize, trials: usize) -> Vec<f64> {
    let mut samples = Vec::with_capacity(trials);
    for trial in 0..trials {
        let pools = layout(fleet_of, 10);
        let target = pools[0].definition.id().clone();
        let members = pools[0].definition.members().to_vec();
        let fleet = Fleet::try_start(pools).expect("a fleet");
        for p in 0..fleet_of * 10 {
            let n = node(p);
            fleet
                .observe_all(n.clone(), ready_facts(&n))
                .await
                .expect("taken");
        }
        let gate = fleet.pool(&target).expect("the pool");
        let ready = gate.wait_ready().await.expect("ready");
        let run = RunId::new(&format!("run-{trial}")).expect("a valid id");
        gate.begin_planning(run.clone(), Some(ready.epoch))
            .await
            .expect("planning");
        gate.commit_plan(run.clone(), members.clone(), Some(ready.epoch))
            .await
            .expect("committed");
        let mut events = gate.subscribe_from_now();
        let dead = MembershipUpdate {
            node: members[0].clone(),
            state: SwimState::Dead,
            incarnation: 1,
        };
        let began = Instant::now();
        fleet.membership(dead).await.expect("taken");
        faulted(&mut events, &run).await;
        samples.push(began.elapsed().as_secs_f64() * 1e6);
        fleet.stop();
    }
    samples
}

/// The config text of an orchestrator on loopback (no keys: a
/// measurement, not a deployment) over `pools`, each `[pools.<id>]`.
fn orchestrator_config(pools: &[GateSettings]) -> poolgate::Config {
    let mut text = String::from(
        "[readiness]\nconvergence_window = \"20ms\"\n[swim]\nbind = \"127.0.0.1:0\"\ninsecure = true\n[agents]\nlisten = \"127.0.0.1:0\"\n",
    );
    for pool in pools {
        let members: Vec<String> = pool
            .definition
            .members()
            .iter()
            .map(|m| format!("\"{m}\""))
            .collect();
        text.push_str(&format!(
            "[pools.{}]\nmembers = [{}]\n",
            pool.definition.id(),
            members.join(", ")
        ));
    }
    poolgate::Config::parse(&text, "fleet example").expect("a valid config")
}

/// Waits until the heap stops shrinking (the actors, tasks and threads
/// of what was stopped have dropped what they held), at most 5 s: a
/// measurement that began earlier would count what they free meanwhile
/// against what it holds.
async fn settled() {
    let (mut last, mut still) = (live(), 0);
    for _ in 0..250 {
        actix_rt::time::sleep(Duration::from_millis(20)).await;
        let now = live();
        still = if now == last { still + 1 } else { 0 };
        if still == 5 {
            return;
        }
        last = now;
    }
}

/// Live orchestrators over `layout(pools, size)`, fed every node's facts
/// to ready: one with every pool (`one`), or one per pool; the heap they
/// hold (gate, SWIM member, agent listener and their tables each), from
/// a settled heap to ready.
async fn orchestrators_heap(pools: usize, size: usize, one: bool) -> isize {
    settled().await;
    let before = live();
    let layout = layout(pools, size);
    let configs: Vec<poolgate::Config> = match one {
        true => vec![orchestrator_config(&layout)],
        false => layout.chunks(1).map(orchestrator_config).collect(),
    };
    let mut started = Vec::new();
    for config in &configs {
        let live = poolgate::live::Orchestrator::start(config)
            .await
            .expect("an orchestrator");
        for definition in config.pool_definitions() {
            for n in definition.members() {
                live.fleet
                    .observe_all(n.clone(), ready_facts(n))
                    .await
                    .expect("taken");
            }
        }
        started.push(live);
    }
    for live in &started {
        for id in live.fleet.pools() {
            live.fleet
                .pool(&id)
                .expect("a pool")
                .wait_ready()
                .await
                .expect("ready");
        }
    }
    let held = live() - before;
    for live in started {
        live.stop().await;
    }
    held
}

fn median(mut samples: Vec<f64>) -> (f64, f64) {
    samples.sort_by(f64::total_cmp);
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.99))
}

/// `--layouts 100x10,10x100` (pools × members, the default), and
/// `--only orchestrators` for the live orchestrators' heap alone.
fn layouts(args: &[String]) -> Result<Vec<(usize, usize)>, String> {
    let Some(at) = args.iter().position(|a| a == "--layouts") else {
        return Ok(vec![(100, 10), (10, 100)]);
    };
    let text = args.get(at + 1).ok_or("--layouts POOLSxSIZE,…")?;
    text.split(',')
        .map(|layout| {
            let (pools, size) = layout
                .split_once('x')
                .ok_or(format!("--layouts: {layout} is not POOLSxSIZE"))?;
            let number = |n: &str| {
                n.parse::<usize>()
                    .map_err(|e| format!("--layouts: {n}: {e}"))
            };
            Ok((number(pools)?, number(size)?))
        })
        .collect()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let json = args.iter().any(|a| a == "--json");
    let only_orchestrators = args
        .windows(2)
        .any(|w| w[0] == "--only" && w[1] == "orchestrators");
    let layouts = match layouts(&args) {
        Ok(layouts) => layouts,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    };
    actix::System::new().block_on(async move {
        let mut lines = Vec::new();
        for &(pools, size) in layouts.iter().filter(|_| !only_orchestrators) {
            // Warm the runtime's tables first, so neither side pays for them.
            let _ = repeated(fleet_footprint, pools, size, 2).await;
            let _ = repeated(gates_footprint, pools, size, 2).await;
            let gates = repeated(gates_footprint, pools, size, 20).await;
            let fleet = repeated(fleet_footprint, pools, size, 20).await;
            lines.push(format!(
                r#"{{"measure":"footprint","pools":{pools},"size":{size},"fleet_heap_bytes":{},"gates_heap_bytes":{},"fleet_cpu_ms":{:.1},"gates_cpu_ms":{:.1},"fleet_wall_ms":{:.1},"gates_wall_ms":{:.1}}}"#,
                fleet.heap, gates.heap, fleet.cpu_ms, gates.cpu_ms, fleet.wall_ms, gates.wall_ms
            ));
        }
        for &(pools, size) in &layouts {
            let _ = orchestrators_heap(pools, size, true).await;
            let (mut separate, mut one) = (Vec::new(), Vec::new());
            for _ in 0..5 {
                separate.push(orchestrators_heap(pools, size, false).await as f64);
                one.push(orchestrators_heap(pools, size, true).await as f64);
            }
            let (separate, one) = (median(separate).0, median(one).0);
            lines.push(format!(
                r#"{{"measure":"orchestrators","pools":{pools},"size":{size},"one_fleet_orchestrator_heap_bytes":{one:.0},"orchestrator_per_pool_heap_bytes":{separate:.0}}}"#
            ));
        }
        let observations: &[(usize, usize)] = match only_orchestrators {
            true => &[],
            false => &[(100, 1), (100, 10), (100, 100), (10, 1), (1000, 1)],
        };
        for &(pools, holders) in observations {
            let cost = observation_cost(pools, holders, 2_000).await;
            lines.push(format!(
                r#"{{"measure":"observation","fleet_nodes":{},"pools":{pools},"pools_holding_the_node":{holders},"us_per_observation":{cost:.2}}}"#,
                pools * 9 + 1
            ));
        }
        let latencies: &[usize] = if only_orchestrators { &[] } else { &[1, 100] };
        for &fleet_of in latencies {
            let (p50, p99) = median(fault_latency(fleet_of, 100).await);
            lines.push(format!(
                r#"{{"measure":"fault_latency","pools":{fleet_of},"p50_us":{p50:.1},"p99_us":{p99:.1}}}"#
            ));
        }
        for line in lines {
            if json {
                println!("{line}");
            } else {
                println!("{}", line.replace(['{', '}', '"'], "").replace(',', "  "));
            }
        }
    });
}
