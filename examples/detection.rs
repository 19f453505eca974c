//! Failure-detection latency of the live demo: the time from `node_crashed`
//! to `run_faulted`, with the shipped `[swim]` settings, over several runs.
//!
//! ```text
//! cargo run --release --example detection -- [RUNS] [CONFIG]
//! ```
//!
//! Each run is a fresh cluster (its own actix system and sockets). The
//! convergence window is shortened to 1 s to save time; it does not take
//! part in detection.

use std::time::Duration;

use poolgate::live::demo;
use poolgate::Config;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let runs: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(10);
    let path = args.next().unwrap_or_else(|| "config.toml".into());
    let mut config = Config::load(path.as_ref())?;
    config.convergence_window = Duration::from_secs(1);
    if let Some(timeout) = config.planning.wait_timeout.as_mut() {
        *timeout = (*timeout).max(Duration::from_secs(2));
    }
    println!(
        "{runs} runs, {} nodes, probe_period {:?}, probe_rtt {:?}, suspicion_timeout {:?}",
        config.demo.nodes,
        config.swim.timings.probe_period,
        config.swim.timings.probe_rtt,
        config.swim.timings.suspicion_timeout
    );
    let mut latencies = Vec::with_capacity(runs);
    for seed in 0..runs as u64 {
        let system = actix::System::new();
        let outcome = system.block_on(demo::run(&config, seed, |_| {}))?;
        let latency = outcome.faulted_at - outcome.crashed_at;
        println!(
            "run {seed}: crash → run_faulted {:.3}s",
            latency.as_secs_f64()
        );
        latencies.push(latency);
    }
    latencies.sort();
    let median = if runs % 2 == 1 {
        latencies[runs / 2]
    } else {
        (latencies[runs / 2 - 1] + latencies[runs / 2]) / 2
    };
    println!(
        "median {:.3}s, min {:.3}s, max {:.3}s",
        median.as_secs_f64(),
        latencies[0].as_secs_f64(),
        latencies[runs - 1].as_secs_f64()
    );
    Ok(())
}
