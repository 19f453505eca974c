//! Failure-detection latency of the live cluster: SIGKILL of a required
//! node's process → `run_faulted`, with the shipped `[swim]` settings.
//!
//! ```text
//! cargo build --release && cargo run --release --example detection -- [--nodes N] [--kills K] [--json] [--insecure] [--config FILE]
//! ```
//!
//! One cluster of N `poolgate node` processes (the release binary beside
//! this example) and the orchestrator in this process. Each round waits
//! for `PoolReady`, commits a run requiring every node, SIGKILLs a random
//! node's process, measures until `run_faulted`, and restarts the killed
//! node (a new process on a new port) for the next round. The convergence
//! window is shortened to 1 s to save time; it takes no part in detection.

use std::time::{Duration, Instant};

use poolgate::cli::cluster::{ClusterPlan, LocalCluster};
use poolgate::core::{Event, RunId};
use poolgate::Config;
use rand::RngExt;

struct Args {
    nodes: u32,
    kills: usize,
    json: bool,
    insecure: bool,
    config: String,
}

fn args() -> Result<Args, Box<dyn std::error::Error>> {
    let mut args = Args {
        nodes: 16,
        kills: 20,
        json: false,
        insecure: false,
        config: "config.toml".into(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--nodes" => args.nodes = it.next().ok_or("--nodes N")?.parse()?,
            "--kills" => args.kills = it.next().ok_or("--kills K")?.parse()?,
            "--json" => args.json = true,
            "--insecure" => args.insecure = true,
            "--config" => args.config = it.next().ok_or("--config FILE")?,
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    Ok(args)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = args()?;
    let mut config = Config::load(args.config.as_ref())?;
    config.convergence_window = Duration::from_secs(1);
    config.planning.wait_timeout = None;
    let binary = std::env::current_exe()?
        .parent()
        .and_then(|examples| examples.parent())
        .map(|dir| dir.join("poolgate"))
        .ok_or("no target folder")?;
    let plan = ClusterPlan {
        binary,
        nodes: args.nodes,
        base: config.clone(),
        seed: 7,
        health_check: None,
        health_interval: Duration::from_secs(5),
        external_orchestrator: false,
        node_log: None,
        insecure: args.insecure,
        record: None,
    };
    let system = actix::System::new();
    let mut idle_figures = (0u64, 0.0f64);
    let (latencies, ready) = system.block_on(async {
        let mut cluster = LocalCluster::prepare(&plan).await?;
        let started = Instant::now();
        for i in 0..cluster.nodes.len() {
            cluster.spawn(i)?;
        }
        let gate = cluster
            .orchestrator()
            .ok_or("no orchestrator")?
            .gate
            .clone();
        let mut events = gate.subscribe();
        let mut latencies = Vec::new();
        let members = cluster.config.pool.members().to_vec();
        // Idle cost of a node process: resident memory and CPU over 10 s
        // of a ready, quiet cluster.
        gate.wait_ready().await?;
        let first_ready = started.elapsed();
        let pids: Vec<u32> = (0..cluster.nodes.len())
            .filter_map(|i| cluster.pid(i))
            .collect();
        let before: Vec<u64> = pids.iter().map(|p| cpu_ticks(*p)).collect();
        let idle = Duration::from_secs(10);
        tokio::time::sleep(idle).await;
        let cpu_pct = pids
            .iter()
            .zip(&before)
            .map(|(p, b)| (cpu_ticks(*p) - b) as f64 / 100.0 / idle.as_secs_f64() * 100.0)
            .fold(0.0f64, f64::max);
        let rss_kib = pids.iter().map(|p| rss_kib(*p)).max().unwrap_or(0);
        idle_figures = (rss_kib, cpu_pct);
        for round in 0..args.kills {
            let proof = gate.wait_ready().await?;
            let run = RunId::new(&format!("r{round}"))?;
            gate.begin_planning(run.clone(), Some(proof.epoch)).await?;
            gate.commit_plan(run.clone(), members.clone(), Some(proof.epoch))
                .await?;
            let victim = rand::rng().random_range(0..cluster.nodes.len());
            while events.try_recv().is_ok() {}
            let killed = Instant::now();
            cluster.kill(victim);
            loop {
                match events.recv().await {
                    Some(Event::RunFaulted { run: r, .. }) if r == run => break,
                    Some(_) => {}
                    None => return Err("the gate stopped".into()),
                }
            }
            let latency = killed.elapsed();
            if !args.json {
                println!(
                    "round {round}: SIGKILL {} → run_faulted {:.3}s",
                    cluster.nodes[victim].name,
                    latency.as_secs_f64()
                );
            }
            latencies.push(latency);
            cluster.spawn(victim)?;
        }
        Ok::<_, Box<dyn std::error::Error>>((latencies, first_ready))
    })?;
    let mut sorted = latencies.clone();
    sorted.sort();
    let median = sorted[sorted.len() / 2];
    let max = sorted[sorted.len() - 1];
    let ms = |d: Duration| (d.as_secs_f64() * 1000.0 * 10.0).round() / 10.0;
    if args.json {
        let n = args.nodes;
        println!(
            "{{\"metric\":\"live_fault_ms_p50\",\"nodes\":{n},\"kills\":{},\"value\":{}}}",
            sorted.len(),
            ms(median)
        );
        println!(
            "{{\"metric\":\"live_fault_ms_max\",\"nodes\":{n},\"kills\":{},\"value\":{}}}",
            sorted.len(),
            ms(max)
        );
        println!(
            "{{\"metric\":\"live_first_ready_ms\",\"nodes\":{n},\"value\":{}}}",
            ms(ready)
        );
        println!(
            "{{\"metric\":\"node_rss_kib_max\",\"nodes\":{n},\"value\":{}}}",
            idle_figures.0
        );
        println!(
            "{{\"metric\":\"node_idle_cpu_pct_max\",\"nodes\":{n},\"value\":{:.2}}}",
            idle_figures.1
        );
    } else {
        println!(
            "{} kills of {} nodes: median {:.3}s, min {:.3}s, max {:.3}s; first PoolReady {:.3}s after the processes started",
            sorted.len(),
            args.nodes,
            median.as_secs_f64(),
            sorted[0].as_secs_f64(),
            max.as_secs_f64(),
            ready.as_secs_f64()
        );
        println!(
            "idle node process: at most {} KiB resident, {:.2}% of a core",
            idle_figures.0, idle_figures.1
        );
    }
    Ok(())
}

/// utime + stime of a process, in clock ticks (1/100 s).
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which is in parentheses).
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    field(11) + field(12)
}

/// Resident memory of a process, in KiB.
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}
