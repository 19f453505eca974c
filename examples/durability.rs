//! What durability and recording cost (design §9), each against its baseline
//! in the same run, on the real clock:
//!
//! - `commit_plan` latency with the redb state file vs in memory;
//! - observations per second through the actors with `--record` (to a
//!   file) vs without.
//!
//! ```text
//! cargo run --release --example durability -- [--json]
//! ```

use std::time::Instant;

use poolgate::core::{AgentReport, NodeId, RunId};
use poolgate::{Config, Gate, GateSettings, Recording};

const NODES: usize = 1000;
const COMMITS: usize = 300;
const OBSERVATIONS: usize = 200_000;

fn members(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("n{i}")).collect()
}

fn config(n: usize) -> Result<Config, Box<dyn std::error::Error>> {
    let list: Vec<String> = members(n).iter().map(|m| format!("\"{m}\"")).collect();
    let text = format!(
        "[pool]\nid = \"p\"\nmembers = [{}]\n[readiness]\nconvergence_window = \"10ms\"\n",
        list.join(", ")
    );
    Ok(Config::parse(&text, "durability")?)
}

/// Every name made ready through the testing module's script (known,
/// alive, available, identity).
async fn make_ready(gate: &Gate, names: &[String]) -> Result<(), Box<dyn std::error::Error>> {
    for name in names {
        let node = NodeId::new(name)?;
        poolgate_actors::testing::make_ready(gate, &node, name.as_bytes()).await?;
    }
    Ok(())
}

/// Commit latencies (µs) of `COMMITS` plan/commit/finish rounds.
fn commit_latencies(settings: GateSettings) -> Result<Vec<f64>, Box<dyn std::error::Error>> {
    actix::System::new().block_on(async move {
        let gate = Gate::start(settings);
        make_ready(&gate, &members(3)).await?;
        let proof = gate.wait_ready().await?;
        let mut latencies = Vec::with_capacity(COMMITS);
        for i in 0..COMMITS {
            let run = RunId::new(&format!("r{i}"))?;
            gate.begin_planning(run.clone(), Some(proof.epoch)).await?;
            let started = Instant::now();
            gate.commit_plan(run.clone(), vec![NodeId::new("n0")?], Some(proof.epoch))
                .await?;
            latencies.push(started.elapsed().as_secs_f64() * 1e6);
            gate.finish_run(run).await?;
        }
        Ok(latencies)
    })
}

/// Observations per second that change the view (availability flips).
fn observations_per_s(settings: GateSettings) -> Result<f64, Box<dyn std::error::Error>> {
    actix::System::new().block_on(async move {
        let gate = Gate::start(settings);
        let names = members(NODES);
        let nodes: Vec<NodeId> = names
            .iter()
            .map(|n| NodeId::new(n))
            .collect::<Result<_, _>>()?;
        let started = Instant::now();
        for i in 0..OBSERVATIONS {
            let node = nodes[i % NODES].clone();
            let report = if (i / NODES).is_multiple_of(2) {
                AgentReport::Available { node }
            } else {
                AgentReport::Unavailable { node }
            };
            gate.agent(report).await?;
        }
        // The last change reached the pool (a report waits behind it).
        gate.report().await?;
        Ok(OBSERVATIONS as f64 / started.elapsed().as_secs_f64())
    })
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let json = std::env::args().any(|a| a == "--json");
    let dir = std::env::temp_dir().join(format!("poolgate-durability-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;

    let small = config(3)?;
    let mut memory = commit_latencies(small.gate_settings()?)?;
    let state = dir.join("state.db");
    let mut durable = commit_latencies(small.gate_settings_with_state(Some(&state))?)?;
    memory.sort_by(f64::total_cmp);
    durable.sort_by(f64::total_cmp);

    let big = config(NODES)?;
    let plain = observations_per_s(big.gate_settings()?)?;
    let mut recorded = big.gate_settings()?;
    let file = std::fs::File::create(dir.join("record.jsonl"))?;
    recorded.record = Some(Recording::new(Box::new(std::io::BufWriter::new(file))));
    let with_record = observations_per_s(recorded)?;
    let _ = std::fs::remove_dir_all(&dir);

    let figures = [
        ("commit_us_p50", "memory", percentile(&memory, 0.5)),
        ("commit_us_p99", "memory", percentile(&memory, 0.99)),
        ("commit_us_p50", "redb", percentile(&durable, 0.5)),
        ("commit_us_p99", "redb", percentile(&durable, 0.99)),
    ];
    if json {
        for (metric, store, value) in figures {
            println!("{{\"metric\":\"{metric}\",\"store\":\"{store}\",\"commits\":{COMMITS},\"value\":{value:.0}}}");
        }
        println!(
            "{{\"metric\":\"observations_per_s_recorded\",\"nodes\":{NODES},\"baseline\":{plain:.0},\"ratio\":{:.2},\"value\":{with_record:.0}}}",
            with_record / plain
        );
    } else {
        for (metric, store, value) in figures {
            println!("{metric} ({store}): {value:.0} µs");
        }
        println!(
            "observations/s: {plain:.0} without a recording, {with_record:.0} with one ({:.2}×)",
            with_record / plain
        );
    }
    Ok(())
}
