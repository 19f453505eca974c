//! What each SWIM profile tolerates and how fast it finds a lost node,
//! side by side in one run (design §15; BENCHMARKS.md, "SWIM profiles").
//!
//! ```text
//! cargo build --release && cargo run --release --example profiles -- [--nodes N] [--tries T] [--starve SECONDS] [--shares 1,0.5,0.2] [--only starve] [--json]
//! ```
//!
//! For each profile (`steady`, the default, and `fast`), one cluster of N
//! `poolgate node` processes (the release binary beside this example) on
//! 127.0.0.1 and the orchestrator in this process, a run committed over
//! every node, then:
//!
//! - stalls: a random node agent stopped (SIGSTOP) for 0.5, 1 and 1.5 s,
//!   T times each; a stall "faults" when `run_faulted` or
//!   `readiness_lost` follows within 3 s of it (the run is then committed
//!   again);
//! - starvation (with `--starve S`, as root, cgroup v1 `cpu`): one node
//!   agent held to 1% of a core for S seconds (`cpu.cfs_quota_us` 1,000 of
//!   100,000): the faults meanwhile; `--shares` gives other shares, in
//!   percent of a core, each measured in turn (the share below which a
//!   profile starts to fault); `--only starve` measures nothing else;
//! - a node frozen for good (SIGSTOP, continued once measured), which no
//!   one can tell from a lost host: the time to `run_faulted`, T times.

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use poolgate::cli::cluster::{ClusterPlan, LocalCluster};
use poolgate::config::SwimTimings;
use poolgate::core::{Event, RunId};
use poolgate::{Config, EventStream, Gate};
use rand::RngExt;

struct Args {
    nodes: u32,
    tries: usize,
    starve: u64,
    /// Shares of a core to starve a node agent to, in percent.
    shares: Vec<f64>,
    /// Only the starvation.
    only_starve: bool,
    json: bool,
}

fn args() -> Result<Args, Box<dyn std::error::Error>> {
    let mut args = Args {
        nodes: 8,
        tries: 10,
        starve: 0,
        shares: vec![1.0],
        only_starve: false,
        json: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--nodes" => args.nodes = it.next().ok_or("--nodes N")?.parse()?,
            "--tries" => args.tries = it.next().ok_or("--tries T")?.parse()?,
            "--starve" => args.starve = it.next().ok_or("--starve SECONDS")?.parse()?,
            "--shares" => {
                args.shares = it
                    .next()
                    .ok_or("--shares 1,0.5,…")?
                    .split(',')
                    .map(|p| p.trim().parse::<f64>())
                    .collect::<Result<_, _>>()?;
                if args.shares.iter().any(|p| !(0.1..=100.0).contains(p)) {
                    return Err("--shares: each from 0.1 to 100 (percent of a core)".into());
                }
            }
            "--only" => match it.next().as_deref() {
                Some("starve") => args.only_starve = true,
                _ => return Err("--only starve".into()),
            },
            "--json" => args.json = true,
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    Ok(args)
}

const BASE: &str = r#"
[pool]
id = "profiles"
members = ["unused"]
[readiness]
convergence_window = "500ms"
[planning]
on_readiness_lost = "wait"
"#;

/// What one profile did.
#[derive(Default)]
struct Figures {
    /// (stall in ms, tries, faults)
    stalls: Vec<(u64, usize, usize)>,
    /// (share of a core in percent, faults while starved to it).
    starved: Vec<(f64, usize)>,
    /// Frozen node → `run_faulted`.
    found: Vec<Duration>,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = args()?;
    let binary = std::env::current_exe()?
        .parent()
        .and_then(|examples| examples.parent())
        .map(|dir| dir.join("poolgate"))
        .ok_or("no target folder")?;
    let mut all = Vec::new();
    for (name, timings) in [("steady", SwimTimings::STEADY), ("fast", SwimTimings::FAST)] {
        let mut base = Config::parse(BASE, "profiles")?;
        base.swim.timings = timings;
        let plan = ClusterPlan {
            binary: binary.clone(),
            nodes: args.nodes,
            base,
            seed: 11,
            health_check: None,
            health_interval: Duration::from_secs(5),
            external_orchestrator: false,
            node_log: None,
            insecure: false,
            record: None,
        };
        let figures = actix::System::new().block_on(measure(&plan, &args))?;
        all.push((name, figures));
    }
    for (name, figures) in &all {
        let mut found = figures.found.clone();
        found.sort();
        let ms = |d: Duration| d.as_millis();
        let p50 = found.get(found.len() / 2).copied().unwrap_or_default();
        let p99 = found.last().copied().unwrap_or_default();
        if args.json {
            for (stall, tries, faults) in &figures.stalls {
                println!("{{\"metric\":\"stall_faults\",\"profile\":\"{name}\",\"stall_ms\":{stall},\"tries\":{tries},\"value\":{faults}}}");
            }
            for (share, faults) in &figures.starved {
                println!("{{\"metric\":\"starved_faults\",\"profile\":\"{name}\",\"share_percent\":{share},\"seconds\":{},\"value\":{faults}}}", args.starve);
            }
            if !found.is_empty() {
                println!("{{\"metric\":\"frozen_found_ms_p50\",\"profile\":\"{name}\",\"n\":{},\"value\":{}}}", found.len(), ms(p50));
                println!("{{\"metric\":\"frozen_found_ms_max\",\"profile\":\"{name}\",\"n\":{},\"value\":{}}}", found.len(), ms(p99));
            }
        } else {
            println!("profile {name}:");
            for (stall, tries, faults) in &figures.stalls {
                println!("  stall {stall} ms: {faults} faults in {tries}");
            }
            for (share, faults) in &figures.starved {
                println!(
                    "  held to {share}% of a core for {} s: {faults} faults",
                    args.starve
                );
            }
            if !found.is_empty() {
                println!(
                    "  frozen node found: median {} ms, max {} ms (n = {})",
                    ms(p50),
                    ms(p99),
                    found.len()
                );
            }
        }
    }
    Ok(())
}

async fn measure(plan: &ClusterPlan, args: &Args) -> Result<Figures, Box<dyn std::error::Error>> {
    let mut cluster = LocalCluster::prepare(plan).await?;
    for i in 0..cluster.nodes.len() {
        cluster.spawn(i)?;
    }
    let gate = cluster
        .orchestrator()
        .ok_or("no orchestrator")?
        .gate
        .clone();
    let mut events = gate.subscribe();
    let mut figures = Figures::default();
    let mut round = 0;
    commit(&gate, &cluster, &mut round).await?;
    let stalls: &[u64] = if args.only_starve {
        &[]
    } else {
        &[500, 1000, 1500]
    };
    for &stall_ms in stalls {
        let mut faults = 0;
        for _ in 0..args.tries {
            while events.try_recv().is_ok() {}
            let victim = rand::rng().random_range(0..cluster.nodes.len());
            cluster.signal(victim, Signal::SIGSTOP);
            tokio::time::sleep(Duration::from_millis(stall_ms)).await;
            cluster.signal(victim, Signal::SIGCONT);
            if harmed_within(&mut events, Duration::from_secs(3)).await {
                faults += 1;
                commit(&gate, &cluster, &mut round).await?;
            }
        }
        figures.stalls.push((stall_ms, args.tries, faults));
    }
    for &share in args.shares.iter().filter(|_| args.starve > 0) {
        gate.wait_ready().await?;
        if gate.report().await?.run.is_none() {
            commit(&gate, &cluster, &mut round).await?;
        }
        let victim = rand::rng().random_range(0..cluster.nodes.len());
        let pid = cluster.pid(victim).ok_or("no pid")?;
        let group = format!("/sys/fs/cgroup/cpu/poolgate-starve-{}", std::process::id());
        std::fs::create_dir_all(&group)?;
        // Of a 100 ms period; the kernel takes no quota under 1 ms, so a
        // smaller share takes a longer period.
        let (period, quota) = if share >= 1.0 {
            (100_000u64, (share * 1_000.0) as u64)
        } else {
            ((100_000.0 / share) as u64, 1_000)
        };
        std::fs::write(
            format!("{group}/cpu.cfs_period_us"),
            period.min(1_000_000).to_string(),
        )?;
        std::fs::write(format!("{group}/cpu.cfs_quota_us"), quota.to_string())?;
        std::fs::write(format!("{group}/cgroup.procs"), pid.to_string())?;
        while events.try_recv().is_ok() {}
        let until = Instant::now() + Duration::from_secs(args.starve);
        let mut faults = 0;
        while Instant::now() < until {
            if harmed_within(&mut events, until - Instant::now()).await {
                faults += 1;
                commit(&gate, &cluster, &mut round).await?;
            }
        }
        std::fs::write("/sys/fs/cgroup/cpu/cgroup.procs", pid.to_string())?;
        let _ = std::fs::remove_dir(&group);
        figures.starved.push((share, faults));
    }
    let frozen_tries = if args.only_starve { 0 } else { args.tries };
    for _ in 0..frozen_tries {
        gate.wait_ready().await?;
        if gate.report().await?.run.is_none() {
            commit(&gate, &cluster, &mut round).await?;
        }
        while events.try_recv().is_ok() {}
        let victim = rand::rng().random_range(0..cluster.nodes.len());
        cluster.signal(victim, Signal::SIGSTOP);
        let frozen = Instant::now();
        loop {
            match events.recv().await {
                Some(Event::RunFaulted { .. }) => break,
                Some(_) => {}
                None => return Err("the gate stopped".into()),
            }
        }
        figures.found.push(frozen.elapsed());
        cluster.signal(victim, Signal::SIGCONT);
        commit(&gate, &cluster, &mut round).await?;
    }
    Ok(figures)
}

/// Waits for readiness and commits a run over every node.
async fn commit(
    gate: &Gate,
    cluster: &LocalCluster,
    round: &mut usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let proof = gate.wait_ready().await?;
    if let Some(run) = gate.report().await?.run {
        gate.finish_run(run).await?;
    }
    *round += 1;
    let run = RunId::new(&format!("r{round}"))?;
    let members = cluster.config.pool.members().to_vec();
    gate.begin_planning(run.clone(), Some(proof.epoch)).await?;
    gate.commit_plan(run, members, Some(proof.epoch)).await?;
    Ok(())
}

/// Whether a fault or a loss of readiness comes within `within`.
async fn harmed_within(events: &mut EventStream, within: Duration) -> bool {
    tokio::time::timeout(within, async {
        loop {
            match events.recv().await {
                Some(Event::RunFaulted { .. } | Event::ReadinessLost { .. }) | None => return,
                Some(_) => {}
            }
        }
    })
    .await
    .is_ok()
}
