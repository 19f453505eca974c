//! How the gate's cost grows with the pool, measured side by side with
//! baselines in the same process (the machines are shared and noisy, so
//! targets are ratios).
//!
//! ```text
//! cargo run --release --example scale -- --json          # full sizes
//! cargo run --release --example scale -- --json --quick  # tiny sizes (smoke)
//! ```
//!
//! One JSON object per line: `metric`, `value`, and where it applies
//! `baseline`, `ratio`, `nodes`. BENCHMARKS.md says what each measures.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use actix::{Actor, Addr, Context, Handler, Message};
use poolgate::core::{AgentReport, Input, MembershipUpdate, RegistryFact};
use poolgate::Gate;
use poolgate::GateSettings;
use poolgate_actors::core::{
    Applied, Event, IdentityMaterial, NodeFacts, NodeId, Observation, OnReadinessLost,
    PlanningPolicy, PoolDefinition, PoolId, PoolReadiness, RunId, SlotKey, SwimState, Time,
};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde_json::json;

struct Sizes {
    core: [usize; 3],
    core_stream: usize,
    actor_nodes: usize,
    actor_stream: usize,
    memory_nodes: usize,
    fault_nodes: usize,
    fault_trials: usize,
    overshoot_trials: usize,
    replay_records: usize,
}

const FULL: Sizes = Sizes {
    core: [100, 10_000, 100_000],
    core_stream: 2_000_000,
    actor_nodes: 10_000,
    actor_stream: 500_000,
    memory_nodes: 100_000,
    fault_nodes: 10_000,
    fault_trials: 200,
    overshoot_trials: 100,
    replay_records: 1_000_000,
};

const QUICK: Sizes = Sizes {
    core: [10, 100, 1_000],
    core_stream: 10_000,
    actor_nodes: 100,
    actor_stream: 2_000,
    memory_nodes: 1_000,
    fault_nodes: 100,
    fault_trials: 5,
    overshoot_trials: 5,
    replay_records: 2_000,
};

thread_local! {
    static EMITTED: std::cell::RefCell<Vec<String>> = const { std::cell::RefCell::new(Vec::new()) };
}

fn emit(json: bool, value: serde_json::Value) {
    EMITTED.with(|e| {
        e.borrow_mut()
            .push(value["metric"].as_str().unwrap_or_default().to_string())
    });
    if json {
        println!("{value}");
    } else {
        let metric = value["metric"].as_str().unwrap_or_default();
        let nodes = value
            .get("nodes")
            .map(|n| format!(" at {n} nodes"))
            .unwrap_or_default();
        let rest = match (value.get("baseline"), value.get("ratio")) {
            (Some(b), Some(r)) => format!(" (baseline {b}, ratio {r})"),
            _ => String::new(),
        };
        println!("{metric}{nodes}: {}{rest}", value["value"]);
    }
}

fn names(n: usize) -> Vec<NodeId> {
    (0..n)
        .map(|i| NodeId::new(&format!("node-{i}")).expect("valid id"))
        .collect()
}

fn settings(members: Vec<NodeId>, window: Duration) -> GateSettings {
    let definition = PoolDefinition::new(PoolId::new("scale").expect("valid id"), members)
        .expect("distinct members");
    let policy = PlanningPolicy {
        on_readiness_lost: OnReadinessLost::Wait,
        wait_timeout: None,
    };
    GateSettings::new(definition, window, policy).expect("valid settings")
}

fn ready_facts(node: &NodeId) -> Vec<Input> {
    vec![
        Input::from(RegistryFact::Known { node: node.clone() }),
        Input::from(MembershipUpdate {
            node: node.clone(),
            state: SwimState::Alive,
            incarnation: 1,
        }),
        Input::from(AgentReport::Available { node: node.clone() }),
        Input::from(
            AgentReport::identity(node.clone(), node.as_str().as_bytes().to_vec()).expect("valid"),
        ),
    ]
}

/// A SWIM-like stream over `n` nodes: mostly repeats of what is known,
/// flaps (suspect, then refuted at a higher incarnation), a few real
/// availability changes. Ids arrive as strings.
fn stream(n: usize, len: usize, seed: u64) -> Vec<(String, Observation)> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut incarnation = vec![1u64; n];
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        let i = rng.random_range(0..n);
        let id = format!("node-{i}");
        match rng.random_range(0..100) {
            0..70 => out.push((
                id,
                Observation::Swim {
                    state: SwimState::Alive,
                    incarnation: incarnation[i],
                },
            )),
            70..90 => {
                out.push((
                    id.clone(),
                    Observation::Swim {
                        state: SwimState::Suspect,
                        incarnation: incarnation[i],
                    },
                ));
                incarnation[i] += 1;
                out.push((
                    id,
                    Observation::Swim {
                        state: SwimState::Alive,
                        incarnation: incarnation[i],
                    },
                ));
            }
            90..95 => out.push((id, Observation::Available)),
            _ => out.push((id, Observation::Unavailable)),
        }
    }
    out
}

/// The pure core fed a stream: find the node by the id as it arrives,
/// apply, and hand real changes to the pool.
fn core_run(n: usize, feed: &[(String, Observation)]) -> Duration {
    let members = names(n);
    let (mut pool, added) = PoolReadiness::new(
        &settings(members, Duration::from_secs(5)).definition,
        Duration::from_secs(5),
        Time::ZERO,
    );
    let mut nodes: HashMap<NodeId, (SlotKey, NodeFacts)> = added
        .into_iter()
        .map(|(id, key)| (id, (key, NodeFacts::default())))
        .collect();
    let mut out: Vec<Event> = Vec::new();
    // Every node starts known, alive at incarnation 1, available and with
    // identity (untimed), so the stream's mix of repeats and changes is the
    // same at every size.
    for (key, facts) in nodes.values_mut() {
        for observation in [
            Observation::Known,
            Observation::Swim {
                state: SwimState::Alive,
                incarnation: 1,
            },
            Observation::Available,
            Observation::Identity(
                IdentityMaterial::new(vec![7; 32])
                    .expect("valid")
                    .fingerprint(),
            ),
        ] {
            if let Applied::Changed(change) = facts.apply(observation) {
                pool.node_changed(*key, Time::ZERO, &change, &mut out);
            }
        }
    }
    out.clear();
    let start = Instant::now();
    core_loop(&mut pool, &mut nodes, feed, &mut out);
    let spent = start.elapsed();
    std::hint::black_box(pool.counts());
    spent
}

/// The timed part of [`core_run`], alone in a function so a profiler can
/// count it alone (`--toggle-collect='scale::core_loop'`).
#[inline(never)]
fn core_loop(
    pool: &mut PoolReadiness,
    nodes: &mut HashMap<NodeId, (SlotKey, NodeFacts)>,
    feed: &[(String, Observation)],
    out: &mut Vec<Event>,
) {
    for (at, (id, observation)) in feed.iter().enumerate() {
        if let Some((key, facts)) = nodes.get_mut(id.as_str()) {
            if let Applied::Changed(change) = facts.apply(observation.clone()) {
                pool.node_changed(*key, Time::from_millis(at as u64), &change, out);
                out.clear();
            }
        }
    }
}

/// The baseline: a plain map from id to a few fields, plus counters, over
/// the same stream.
fn baseline_run(n: usize, feed: &[(String, Observation)]) -> Duration {
    #[derive(Default)]
    struct Plain {
        state: u8,
        incarnation: u64,
        available: bool,
    }
    let mut nodes: HashMap<String, Plain> = (0..n)
        .map(|i| (format!("node-{i}"), Plain::default()))
        .collect();
    let (mut changes, mut up) = (0u64, 0i64);
    let start = Instant::now();
    for (id, observation) in feed {
        if let Some(node) = nodes.get_mut(id.as_str()) {
            match observation {
                Observation::Swim { state, incarnation } => {
                    let s = *state as u8;
                    if (s, *incarnation) != (node.state, node.incarnation)
                        && *incarnation >= node.incarnation
                    {
                        up += i64::from(s == 0) - i64::from(node.state == 0);
                        node.state = s;
                        node.incarnation = *incarnation;
                        changes += 1;
                    }
                }
                Observation::Available | Observation::Unavailable => {
                    let a = matches!(observation, Observation::Available);
                    if a != node.available {
                        node.available = a;
                        changes += 1;
                    }
                }
                _ => {}
            }
        }
    }
    let spent = start.elapsed();
    std::hint::black_box((changes, up));
    spent
}

fn per_second(count: usize, spent: Duration) -> f64 {
    (count as f64 / spent.as_secs_f64()).round()
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

fn core_metrics(sizes: &Sizes, json: bool) {
    let mut ns_per_obs = Vec::new();
    for &n in &sizes.core {
        let feed = stream(n, sizes.core_stream, 7);
        // Warm up both, then take the best of three.
        let core = (0..3).map(|_| core_run(n, &feed)).min().unwrap_or_default();
        let base = (0..3)
            .map(|_| baseline_run(n, &feed))
            .min()
            .unwrap_or_default();
        let (value, baseline) = (per_second(feed.len(), core), per_second(feed.len(), base));
        ns_per_obs.push(core.as_nanos() as f64 / feed.len() as f64);
        emit(
            json,
            json!({"metric": "core_obs_per_s", "value": value, "baseline": baseline, "ratio": round2(value / baseline), "nodes": n}),
        );
    }
    emit(
        json,
        json!({"metric": "core_flatness", "value": round2(ns_per_obs[2] / ns_per_obs[0])}),
    );
}

/// The same hops as the gate, with trivial handlers.
struct BareNode {
    sink: Addr<BareSink>,
}
struct BareSink {
    seen: u64,
}
impl Actor for BareNode {
    type Context = Context<Self>;
}
impl Actor for BareSink {
    type Context = Context<Self>;
}
struct Ping {
    _at: Time,
    _observation: Observation,
}

impl Message for Ping {
    type Result = ();
}
struct Count;

impl Message for Count {
    type Result = u64;
}
impl Handler<Ping> for BareNode {
    type Result = ();
    fn handle(&mut self, msg: Ping, _ctx: &mut Context<Self>) {
        self.sink.do_send(msg);
    }
}
impl Handler<Ping> for BareSink {
    type Result = ();
    fn handle(&mut self, _msg: Ping, _ctx: &mut Context<Self>) {
        self.seen += 1;
    }
}
impl Handler<Count> for BareSink {
    type Result = u64;
    fn handle(&mut self, _msg: Count, _ctx: &mut Context<Self>) -> u64 {
        self.seen
    }
}

const PRODUCERS: usize = 32;

async fn actor_metric(sizes: &Sizes, json: bool) {
    let n = sizes.actor_nodes;
    let members = names(n);
    let feed = stream(n, sizes.actor_stream, 11);
    let shares = |feed: &[(String, Observation)]| -> Vec<Vec<(String, Observation)>> {
        let mut shares = vec![Vec::new(); PRODUCERS];
        for (id, observation) in feed {
            let i = id.len() + id.bytes().map(usize::from).sum::<usize>();
            shares[i % PRODUCERS].push((id.clone(), observation.clone()));
        }
        shares
    };

    // The gate: the embedding API, one observation in flight per producer.
    let gate = Gate::start(settings(members.clone(), Duration::from_secs(5)));
    for node in &members {
        for input in ready_facts(node) {
            let _ = gate.submit(gate.clock().now(), input).await;
        }
    }
    let start = Instant::now();
    let mut tasks = Vec::new();
    for share in shares(&feed) {
        let gate = gate.clone();
        tasks.push(actix::spawn(async move {
            for (id, observation) in share {
                let node = NodeId::new(&id).expect("valid id");
                let input = match observation {
                    Observation::Swim { state, incarnation } => Input::from(MembershipUpdate {
                        node,
                        state,
                        incarnation,
                    }),
                    Observation::Available => Input::from(AgentReport::Available { node }),
                    _ => Input::from(AgentReport::Unavailable { node }),
                };
                let _ = gate.submit(gate.clock().now(), input).await;
            }
        }));
    }
    for task in tasks {
        let _ = task.await;
    }
    let _ = gate.report().await;
    let gate_time = start.elapsed();

    // The baseline: a map to bare actors, the same two hops.
    let sink = BareSink { seen: 0 }.start();
    let bare: HashMap<String, Addr<BareNode>> = members
        .iter()
        .map(|m| (m.to_string(), BareNode { sink: sink.clone() }.start()))
        .collect();
    let bare = std::sync::Arc::new(bare);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for share in shares(&feed) {
        let bare = std::sync::Arc::clone(&bare);
        tasks.push(actix::spawn(async move {
            for (id, observation) in share {
                let _node = NodeId::new(&id).expect("valid id");
                if let Some(addr) = bare.get(id.as_str()) {
                    let _ = addr
                        .send(Ping {
                            _at: Time::ZERO,
                            _observation: observation,
                        })
                        .await;
                }
            }
        }));
    }
    for task in tasks {
        let _ = task.await;
    }
    let _ = sink.send(Count).await;
    let bare_time = start.elapsed();
    let (value, baseline) = (
        per_second(feed.len(), gate_time),
        per_second(feed.len(), bare_time),
    );
    emit(
        json,
        json!({"metric": "actor_obs_per_s", "value": value, "baseline": baseline, "ratio": round2(value / baseline), "nodes": n}),
    );
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

async fn memory_metric(sizes: &Sizes, json: bool) {
    let n = sizes.memory_nodes;
    let members = names(n);
    let before = rss_kib();
    let gate = Gate::start(settings(members.clone(), Duration::from_secs(5)));
    for node in &members {
        for input in ready_facts(node) {
            let _ = gate.submit(gate.clock().now(), input).await;
        }
    }
    let _ = gate.report().await;
    let after = rss_kib();
    // The ids themselves are counted: the gate must hold them.
    let bytes = (after.saturating_sub(before) * 1024) as f64 / n as f64;
    emit(
        json,
        json!({"metric": "bytes_per_candidate", "value": bytes.round(), "nodes": n}),
    );
    drop(members);
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

async fn fault_metric(sizes: &Sizes, json: bool) {
    let n = sizes.fault_nodes;
    let members = names(n);
    let window = Duration::from_millis(5);
    let gate = Gate::start(settings(members.clone(), window));
    let mut events = gate.subscribe();
    for node in &members {
        for input in ready_facts(node) {
            let _ = gate.submit(gate.clock().now(), input).await;
        }
    }
    let mut latencies = Vec::new();
    // The plan requires 100 nodes around the victim.
    let victim = members[n / 2].clone();
    let required = members[(n / 2).saturating_sub(50)..(n / 2 + 50).min(n)].to_vec();
    let mut incarnation = 1;
    for trial in 0..sizes.fault_trials {
        let proof = match gate.wait_ready().await {
            Ok(proof) => proof,
            Err(_) => break,
        };
        let run = RunId::new(&format!("run-{trial}")).expect("valid id");
        if gate
            .begin_planning(run.clone(), Some(proof.epoch))
            .await
            .is_err()
            || gate
                .commit_plan(run.clone(), required.clone(), Some(proof.epoch))
                .await
                .is_err()
        {
            continue;
        }
        while events.try_recv().is_ok() {}
        let start = Instant::now();
        gate.membership_nowait(MembershipUpdate {
            node: victim.clone(),
            state: SwimState::Suspect,
            incarnation,
        });
        let faulted = async {
            while let Some(event) = events.recv().await {
                if matches!(event, Event::RunFaulted { .. }) {
                    return Some(start.elapsed());
                }
            }
            None
        };
        match tokio::time::timeout(Duration::from_secs(5), faulted).await {
            Ok(Some(latency)) => latencies.push(latency.as_secs_f64() * 1e6),
            _ => {
                eprintln!("trial {trial}: no run_faulted within 5 s");
                let _ = gate.finish_run(run).await;
            }
        }
        incarnation += 1;
        gate.membership_nowait(MembershipUpdate {
            node: victim.clone(),
            state: SwimState::Alive,
            incarnation,
        });
    }
    latencies.sort_by(f64::total_cmp);
    emit(
        json,
        json!({"metric": "fault_latency_us_p50", "value": round2(percentile(&latencies, 50.0)), "nodes": n}),
    );
    emit(
        json,
        json!({"metric": "fault_latency_us_p99", "value": round2(percentile(&latencies, 99.0)), "nodes": n}),
    );
}

async fn overshoot_metric(sizes: &Sizes, json: bool) {
    let members = names(10);
    let gate = Gate::start(settings(members.clone(), Duration::from_millis(20)));
    let mut events = gate.subscribe();
    for node in &members {
        for input in ready_facts(node) {
            let _ = gate.submit(gate.clock().now(), input).await;
        }
    }
    let mut late = Vec::new();
    for trial in 0..sizes.overshoot_trials {
        while let Some(event) = events.recv().await {
            if let Event::PoolReady { at, .. } = event {
                let due = gate.clock().instant(at);
                late.push(
                    tokio::time::Instant::now()
                        .saturating_duration_since(due)
                        .as_secs_f64()
                        * 1e3,
                );
                break;
            }
        }
        // Move the view so the window starts again.
        gate.membership_nowait(MembershipUpdate {
            node: members[0].clone(),
            state: SwimState::Alive,
            incarnation: 2 + trial as u64,
        });
    }
    late.sort_by(f64::total_cmp);
    emit(
        json,
        json!({"metric": "ready_overshoot_ms_p99", "value": round2(percentile(&late, 99.0))}),
    );
}

fn replay_metric(sizes: &Sizes, json: bool) {
    let n = 1000;
    let mut text = String::with_capacity(sizes.replay_records * 80);
    let members: Vec<String> = (0..n).map(|i| format!("\"node-{i}\"")).collect();
    text.push_str(&format!(
        "{{\"at_ms\":0,\"type\":\"define_pool\",\"pool\":\"scale\",\"members\":[{}]}}\n",
        members.join(",")
    ));
    let feed = stream(n, sizes.replay_records - 1, 13);
    for (i, (id, observation)) in feed.iter().enumerate() {
        let at = i / 10; // ten records per millisecond
        let body = match observation {
            Observation::Swim { state, incarnation } => format!("\"type\":\"swim\",\"node\":\"{id}\",\"state\":\"{state}\",\"incarnation\":{incarnation}"),
            Observation::Available => format!("\"type\":\"available\",\"node\":\"{id}\""),
            _ => format!("\"type\":\"unavailable\",\"node\":\"{id}\""),
        };
        text.push_str(&format!("{{\"at_ms\":{at},{body}}}\n"));
    }
    let records = feed.len() + 1;
    let config = poolgate::Config::parse(
        "[pool]\nid = \"scale\"\nmembers = [\"node-0\"]\n[readiness]\nconvergence_window = \"5s\"\n",
        "scale",
    )
    .expect("valid config");
    let start = Instant::now();
    let mut events = 0u64;
    let result = poolgate::replay::run(&config, text.as_bytes(), |_| {
        events += 1;
        Ok(())
    });
    let spent = start.elapsed();
    if let Err(e) = result {
        eprintln!("replay failed: {e}");
    }
    emit(
        json,
        json!({"metric": "replay_records_per_s", "value": per_second(records, spent)}),
    );
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let json = args.iter().any(|a| a == "--json");
    let sizes = if args.iter().any(|a| a == "--quick") {
        &QUICK
    } else {
        &FULL
    };
    // `--profile-core N`: only the core at N candidates, once, without the
    // baseline: for a profiler (`valgrind --tool=cachegrind`).
    if let Some(at) = args.iter().position(|a| a == "--profile-core") {
        let n = args
            .get(at + 1)
            .and_then(|v| v.parse().ok())
            .unwrap_or(100_000);
        let feed = stream(n, 200_000, 7);
        let spent = core_run(n, &feed);
        println!("{} observations at {n} candidates in {spent:?}", feed.len());
        return;
    }
    run(sizes, json);
}

fn run(sizes: &Sizes, json: bool) {
    // First, while nothing else has been allocated: RSS growth is the gate's.
    actix::System::new().block_on(async {
        memory_metric(sizes, json).await;
    });
    core_metrics(sizes, json);
    actix::System::new().block_on(async {
        actor_metric(sizes, json).await;
    });
    actix::System::new().block_on(async {
        fault_metric(sizes, json).await;
        overshoot_metric(sizes, json).await;
    });
    replay_metric(sizes, json);
}

#[cfg(test)]
mod tests {
    /// Smoke test: every metric comes out at tiny sizes (no speed asserted).
    #[test]
    fn every_metric_is_printed_at_tiny_sizes() {
        super::run(&super::QUICK, true);
        let names = super::EMITTED.with(|e| e.borrow().clone());
        for metric in [
            "core_obs_per_s",
            "core_flatness",
            "actor_obs_per_s",
            "bytes_per_candidate",
            "fault_latency_us_p50",
            "fault_latency_us_p99",
            "ready_overshoot_ms_p99",
            "replay_records_per_s",
        ] {
            assert!(names.iter().any(|n| n == metric), "{metric} missing");
        }
    }
}
