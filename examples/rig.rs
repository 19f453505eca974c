//! Figures from the multi-host rig (BENCHMARKS.md, "Separate hosts"): the
//! operator guide's deployment (docs/operator.md) on network-namespace hosts, real processes, faults
//! from nftables. Needs root, `ip netns` and `nft` (and `serf` for the
//! side-by-side loss figure).
//!
//! ```sh
//! cargo build --release
//! sudo target/release/examples/rig --json                      # crash, isolation, move
//! sudo target/release/examples/rig --json --only loss --loss 10 --minutes 10 --serf
//! ```
//!
//! - `rig_crash_to_fault_ms`: SIGKILL of a required node's process →
//!   `run_faulted` seen on `poolgate run --json`'s stdout (p50/p99/max).
//! - `rig_isolation_to_fault_ms`: every packet of the required node's host
//!   dropped → `run_faulted`.
//! - `rig_orchestrator_moved_ms`: the orchestrator's host vanishes and a
//!   new orchestrator starts on another host → its `pool_ready`.
//! - `rig_heartbeat_cost` (with `--only heartbeat`): bytes a second per
//!   node on the agent port and on SWIM's, and the orchestrator's CPU,
//!   over 30 s with a run guarded over every node
//! - `rig_failover_*_ms` (with `--only failover`, `--failovers N`): two
//!   `watch` replicas on etcd (one member on a host of its own, the
//!   shipped lease), the leader SIGKILLed N times: → the other leads
//!   (`leads`), accepts its first agent frame (`first_frame`), publishes
//!   its first event (`first_event`, `pool_ready`); `guard_gap`: → its
//!   orchestrator guards the run again. `--window` sets the convergence
//!   window (default 1 s; the shipped one is 5 s). Needs `etcd`
//!   (etcd-server).
//! - `rig_loss_false_faults` (with `--only loss`): runs faulted over `--minutes` of `--loss`%
//!   UDP loss on every host (a new run after each), and with `--serf`, the
//!   `member-failed` events of a Serf cluster (`serf agent -profile=lan`)
//!   on the same hosts in the same minutes.
//!
//! - `rig_stall_false_faults` (with `--only stall`): every node agent in
//!   turn stopped (SIGSTOP) for each of `--stalls` seconds (default 0.5,
//!   1, 1.5), `--tries` times each, a run guarded over every node: the
//!   runs faulted within 3 s of a stall (a new run after each), and with
//!   `--serf` the same stalls of the Serf agent beside each node, in the
//!   same moments, and its `member-failed` events.
//! - `rig_starve_false_faults` (with `--only starve`): a node agent held
//!   to each of `--shares` percent of a core (default 5, 2, 1; a cgroup's
//!   `cpu` quota of that many ms per 100 ms) for `--starve` seconds
//!   (default 60), a run guarded over every node: the runs faulted
//!   meanwhile, and with `--serf` the Serf agent beside it held alike,
//!   and its `member-failed` events.
//! - With `--serf`, `--only isolate` also times Serf: the cut → the first
//!   `member-failed` host-1's Serf agent logs for the cut host's agents
//!   (`rig_isolation_to_serf_failed_ms`).
//!
//! `--profile NAME` sets `[swim] profile` on every member (`steady`, the
//! default, or `fast`), so each figure can be taken per profile.

#[path = "../tests/common/deploy.rs"]
mod deploy;
#[path = "../tests/common/rig.rs"]
mod rig;

use std::time::{Duration, Instant};

use deploy::{Deployment, Options};
use rig::{Process, Rig, Starved};

struct Args {
    hosts: usize,
    nodes: usize,
    crashes: usize,
    isolations: usize,
    moves: usize,
    failovers: usize,
    loss: Vec<u32>,
    minutes: f64,
    /// Stall lengths in seconds (`--only stall`).
    stalls: Vec<f64>,
    /// Stalls of each length.
    tries: usize,
    /// Shares of a core to starve a node agent to, in percent (`--only
    /// starve`).
    shares: Vec<f64>,
    /// How long each share is held.
    starve: Duration,
    serf: bool,
    json: bool,
    only: Option<String>,
    indirect_probes: Option<u32>,
    /// `[swim] profile` of every member (the default's when none).
    profile: Option<String>,
    /// The convergence window of the failover runs (the shipped 5 s, or
    /// 1 s by default to keep the run short).
    window: Duration,
}

fn args() -> Result<Args, String> {
    let mut args = Args {
        hosts: 4,
        nodes: 16,
        crashes: 20,
        isolations: 20,
        moves: 3,
        failovers: 20,
        loss: vec![10],
        minutes: 10.0,
        stalls: vec![0.5, 1.0, 1.5],
        tries: 20,
        shares: vec![5.0, 2.0, 1.0],
        starve: Duration::from_secs(60),
        serf: false,
        json: false,
        only: None,
        indirect_probes: None,
        profile: None,
        window: Duration::from_secs(1),
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || it.next().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "--hosts" => args.hosts = value()?.parse().map_err(|e| format!("--hosts: {e}"))?,
            "--nodes" => args.nodes = value()?.parse().map_err(|e| format!("--nodes: {e}"))?,
            "--crashes" => {
                args.crashes = value()?.parse().map_err(|e| format!("--crashes: {e}"))?
            }
            "--isolations" => {
                args.isolations = value()?.parse().map_err(|e| format!("--isolations: {e}"))?
            }
            "--moves" => args.moves = value()?.parse().map_err(|e| format!("--moves: {e}"))?,
            "--failovers" => {
                args.failovers = value()?.parse().map_err(|e| format!("--failovers: {e}"))?
            }
            "--loss" => {
                args.loss = value()?
                    .split(',')
                    .map(|p| p.trim().parse().map_err(|e| format!("--loss: {e}")))
                    .collect::<Result<_, _>>()?
            }
            "--stalls" => {
                args.stalls = value()?
                    .split(',')
                    .map(|p| p.trim().parse().map_err(|e| format!("--stalls: {e}")))
                    .collect::<Result<_, _>>()?
            }
            "--tries" => args.tries = value()?.parse().map_err(|e| format!("--tries: {e}"))?,
            "--shares" => {
                args.shares = value()?
                    .split(',')
                    .map(|p| p.trim().parse().map_err(|e| format!("--shares: {e}")))
                    .collect::<Result<_, _>>()?
            }
            "--starve" => {
                args.starve =
                    Duration::from_secs(value()?.parse().map_err(|e| format!("--starve: {e}"))?)
            }
            "--minutes" => {
                args.minutes = value()?.parse().map_err(|e| format!("--minutes: {e}"))?
            }
            "--serf" => args.serf = true,
            "--json" => args.json = true,
            "--window" => {
                args.window =
                    humantime::parse_duration(&value()?).map_err(|e| format!("--window: {e}"))?
            }
            "--only" => args.only = Some(value()?),
            "--profile" => args.profile = Some(value()?),
            "--indirect-probes" => {
                args.indirect_probes = Some(
                    value()?
                        .parse()
                        .map_err(|e| format!("--indirect-probes: {e}"))?,
                )
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(args)
}

fn main() {
    let args = match args() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    };
    if args.only.as_deref() == Some("failover") {
        failovers(&args);
        return;
    }
    // Two orchestrator hosts (host-1, host-2), then the node hosts.
    let Some(rig) = Rig::new(2 + args.hosts) else {
        std::process::exit(1);
    };
    let node_hosts: Vec<usize> = (0..args.nodes).map(|i| 2 + i % args.hosts).collect();
    let deployment = Deployment::write(
        &rig,
        &[0, 1],
        &node_hosts,
        Options {
            window: Some(Duration::from_secs(1)),
            swim_extra: args
                .indirect_probes
                .map(|k| format!("indirect_probes = {k}\n"))
                .into_iter()
                .chain(
                    args.profile
                        .as_ref()
                        .map(|p| format!("profile = \"{p}\"\n")),
                )
                .collect(),
            ..Options::default()
        },
    );
    let mut nodes = deployment.start_nodes(&rig);
    let wants = |what: &str| args.only.as_deref().is_none_or(|o| o == what);
    if wants("crash") {
        let times = crashes(&rig, &deployment, &mut nodes, args.crashes);
        report(&args, "rig_crash_to_fault_ms", &times);
    }
    if wants("isolate") {
        let mut serfs = serf_joined(&rig, &deployment, &args, "isolate");
        let (times, serf_times) =
            isolations(&rig, &deployment, args.isolations, args.hosts, &mut serfs);
        report(&args, "rig_isolation_to_fault_ms", &times);
        if args.serf {
            report(&args, "rig_isolation_to_serf_failed_ms", &serf_times);
        }
    }
    if args.only.as_deref() == Some("stall") {
        stalls(&rig, &deployment, &args, &nodes);
    }
    if args.only.as_deref() == Some("starve") {
        starvation(&rig, &deployment, &args, &nodes);
    }
    if wants("move") {
        let times = moves(&rig, &deployment, args.moves);
        report(&args, "rig_orchestrator_moved_ms", &times);
    }
    if args.only.as_deref() == Some("heartbeat") {
        heartbeat_cost(&rig, &deployment, &args);
    }
    // The loss figure takes `--minutes` per level: only when asked for.
    if args.only.as_deref() == Some("loss") {
        for percent in args.loss.clone() {
            loss(&rig, &deployment, &args, percent);
        }
    }
    drop(nodes);
}

fn line(args: &Args, metric: &str, fields: serde_json::Value) {
    let mut value = serde_json::json!({
        "metric": metric,
        "nodes": args.nodes,
        "hosts": args.hosts,
    });
    if let (Some(object), Some(extra)) = (value.as_object_mut(), fields.as_object()) {
        object.extend(extra.clone());
    }
    if args.json {
        println!("{value}");
    } else {
        println!("{metric}: {fields}");
    }
}

fn report(args: &Args, metric: &str, times: &[f64]) {
    let mut sorted = times.to_vec();
    sorted.sort_by(f64::total_cmp);
    let at = |q: f64| {
        if sorted.is_empty() {
            return serde_json::Value::Null;
        }
        let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
        serde_json::json!((sorted[i] * 10.0).round() / 10.0)
    };
    line(
        args,
        metric,
        serde_json::json!({"n": sorted.len(), "p50": at(0.5), "p99": at(0.99), "max": at(1.0)}),
    );
}

const READY: Duration = Duration::from_secs(60);

fn guarded_run(rig: &Rig, deployment: &Deployment, require: &str) -> Process {
    let mut run = deployment.orchestrator(
        rig,
        0,
        &[
            "run",
            "--json",
            "--require",
            require,
            "--",
            "sleep",
            "100000",
        ],
    );
    if run.wait_event(READY, "run_committed", &[]).is_none() {
        // What blocks the pool, and every log, kept for a look.
        let config = deployment.orchestrator_config(rig, 0).display().to_string();
        let binary = deploy::binary();
        let mut status = rig.spawn(0, "status", &[&binary, "status", "--config", &config], &[]);
        status.wait_exit(Duration::from_secs(10));
        status.drain();
        let kept = std::env::temp_dir().join("poolgate-rig-failure");
        let _ = std::fs::remove_dir_all(&kept);
        let _ = std::process::Command::new("cp")
            .arg("-r")
            .arg(&rig.dir)
            .arg(&kept)
            .status();
        panic!(
            "no commit; status:\n{}\nrun's stderr:\n{}\nlogs kept in {}",
            status.seen().join("\n"),
            run.stderr(),
            kept.display()
        );
    }
    run
}

fn crashes(rig: &Rig, deployment: &Deployment, nodes: &mut [Process], count: usize) -> Vec<f64> {
    let mut times = Vec::new();
    for k in 0..count {
        let target = k % deployment.nodes.len();
        let name = deployment.nodes[target].name.clone();
        let mut run = guarded_run(rig, deployment, &name);
        std::thread::sleep(Duration::from_millis(500));
        let killed = Instant::now();
        nodes[target].kill();
        let quoted = format!("\"{name}\"");
        match run.wait_event(Duration::from_secs(20), "run_faulted", &[("node", &quoted)]) {
            Some(_) => times.push(killed.elapsed().as_secs_f64() * 1000.0),
            None => eprintln!("crash {k}: no run_faulted within 20 s"),
        }
        run.wait_exit(Duration::from_secs(10));
        run.kill();
        nodes[target] = deployment.start_node(rig, target, &[]);
        eprintln!("crash {}/{count}: {:?} ms", k + 1, times.last());
    }
    times
}

fn isolations(
    rig: &Rig,
    deployment: &Deployment,
    count: usize,
    hosts: usize,
    serfs: &mut [Process],
) -> (Vec<f64>, Vec<f64>) {
    let (mut times, mut serf_times) = (Vec::new(), Vec::new());
    for k in 0..count {
        let host = 2 + k % hosts;
        let target = deployment
            .nodes
            .iter()
            .position(|n| n.host == host)
            .expect("a node on every node host");
        let name = deployment.nodes[target].name.clone();
        let mut run = guarded_run(rig, deployment, &name);
        std::thread::sleep(Duration::from_millis(500));
        let serf_before = serfs.first_mut().map(serf_failed);
        let cut = Instant::now();
        rig.isolate(host);
        let (mut faulted, mut serf_found) = (None, serf_before.is_none());
        while cut.elapsed() < Duration::from_secs(30) && !(faulted.is_some() && serf_found) {
            if faulted.is_none()
                && run
                    .wait_event(Duration::from_millis(20), "run_faulted", &[])
                    .is_some()
            {
                faulted = Some(cut.elapsed().as_secs_f64() * 1000.0);
            }
            if let (Some(before), Some(agent)) = (serf_before, serfs.first_mut()) {
                if !serf_found && serf_failed(agent) > before {
                    serf_found = true;
                    serf_times.push(cut.elapsed().as_secs_f64() * 1000.0);
                }
            }
            if faulted.is_some() && serf_before.is_none() {
                break;
            }
        }
        match faulted {
            Some(ms) => times.push(ms),
            None => eprintln!("isolation {k}: no run_faulted within 30 s"),
        }
        if !serf_found {
            eprintln!("isolation {k}: no Serf member-failed within 30 s");
        }
        run.wait_exit(Duration::from_secs(10));
        run.kill();
        rig.heal(host);
        if !serfs.is_empty() {
            // The cut agents rejoin (Serf reconnects to failed members
            // every 30 s) before the next cut.
            serf_all_alive(rig, serfs.len(), Duration::from_secs(90));
        }
        eprintln!(
            "isolation {}/{count}: {:?} ms, Serf {:?} ms",
            k + 1,
            times.last(),
            serf_times.last()
        );
    }
    (times, serf_times)
}

/// Every node agent in turn stopped for each length of `args.stalls`,
/// `args.tries` times each, with a run guarded over every node (and the
/// Serf agent beside the node stopped with it).
fn stalls(rig: &Rig, deployment: &Deployment, args: &Args, nodes: &[Process]) {
    use nix::sys::signal::Signal;
    let all: Vec<&str> = deployment.nodes.iter().map(|n| n.name.as_str()).collect();
    let require = all.join(",");
    let mut serfs = serf_joined(rig, deployment, args, "stall");
    let mut run = guarded_run(rig, deployment, &require);
    for &stall in &args.stalls {
        let (mut faults, mut serf_failed_events) = (0u32, 0usize);
        for k in 0..args.tries {
            let target = k % nodes.len();
            let before = serfs.first_mut().map(serf_failed);
            nodes[target].signal(Signal::SIGSTOP);
            if let Some(agent) = serfs.get(target + 1) {
                agent.signal(Signal::SIGSTOP);
            }
            std::thread::sleep(Duration::from_secs_f64(stall));
            nodes[target].signal(Signal::SIGCONT);
            if let Some(agent) = serfs.get(target + 1) {
                agent.signal(Signal::SIGCONT);
            }
            // What a stall sets off shows within a few probe periods.
            if let Some(fault) = run.wait_event(Duration::from_secs(3), "run_faulted", &[]) {
                faults += 1;
                eprintln!("stall {stall} s of node {}: {fault}", all[target]);
                run.wait_exit(Duration::from_secs(10));
                run.kill();
                run = guarded_run(rig, deployment, &require);
            }
            if let (Some(before), Some(agent)) = (before, serfs.first_mut()) {
                let failed = serf_failed(agent) - before;
                if failed > 0 {
                    serf_failed_events += failed;
                    eprintln!(
                        "stall {stall} s of serf-{}: {failed} member-failed",
                        all[target]
                    );
                    serf_all_alive(rig, serfs.len(), Duration::from_secs(90));
                }
            }
        }
        line(
            args,
            "rig_stall_false_faults",
            serde_json::json!({
                "stall_s": stall,
                "tries": args.tries,
                "false_faults": faults,
                "serf_member_failed": args.serf.then_some(serf_failed_events),
            }),
        );
    }
    run.kill();
}

fn moves(rig: &Rig, deployment: &Deployment, count: usize) -> Vec<f64> {
    let mut times = Vec::new();
    let mut from = 0;
    let mut current = deployment.orchestrator(rig, from, &["watch", "--json"]);
    if current.wait_event(READY, "pool_ready", &[]).is_none() {
        panic!("no pool_ready; stderr:\n{}", current.stderr());
    }
    for k in 0..count {
        let to = 1 - from;
        rig.isolate(from);
        let moved = Instant::now();
        let mut next = deployment.orchestrator(rig, to, &["watch", "--json"]);
        match next.wait_event(READY, "pool_ready", &[]) {
            Some(_) => times.push(moved.elapsed().as_secs_f64() * 1000.0),
            None => eprintln!("move {k}: no pool_ready within {READY:?}"),
        }
        current.kill();
        rig.heal(from);
        current = next;
        from = to;
        eprintln!("move {}/{count}: {:?} ms", k + 1, times.last());
    }
    times
}

/// Serf agents on the same hosts as the nodes (and one beside each
/// orchestrator host), joined through host-1's.
fn serf(rig: &Rig, deployment: &Deployment) -> Vec<Process> {
    let mut agents = Vec::new();
    let mut hosts: Vec<(String, usize)> = vec![("serf-orch".into(), 0)];
    hosts.extend(
        deployment
            .nodes
            .iter()
            .map(|n| (format!("serf-{}", n.name), n.host)),
    );
    let mut per_host = std::collections::HashMap::new();
    for (name, host) in hosts {
        let port = 7990 + *per_host.entry(host).and_modify(|p| *p += 1).or_insert(0u16);
        let bind = format!("-bind={}:{port}", rig.hosts[host].addr);
        let rpc = format!("-rpc-addr=127.0.0.1:{}", 7890 + port - 7990);
        let node = format!("-node={name}");
        // `-join` exits at once when host-1's agent does not listen yet
        // (the agents start together): each retries until it is in.
        let join = format!("-retry-join={}:7990", rig.hosts[0].addr);
        let mut argv = vec!["serf", "agent", "-profile=lan", &node, &bind, &rpc];
        if !agents.is_empty() {
            argv.extend([join.as_str(), "-retry-interval=1s"]);
        }
        agents.push(rig.spawn(host, &name, &argv, &[]));
    }
    agents
}

/// How many members host-1's Serf agent sees alive.
fn serf_alive(rig: &Rig) -> usize {
    rig.exec(0, &["serf", "members", "-rpc-addr=127.0.0.1:7890"])
        .map(|text| text.lines().filter(|l| l.contains(" alive")).count())
        .unwrap_or(0)
}

/// How many of `agents` still run.
fn serf_running(agents: &mut [Process]) -> usize {
    agents
        .iter_mut()
        .map(|a| a.pid().is_some() && a.wait_exit(Duration::from_millis(30)).is_none())
        .filter(|running| *running)
        .count()
}

/// A node agent in turn held to each share of `args.shares` for
/// `args.starve`, with a run guarded over every node (and the Serf agent
/// beside it held alike).
fn starvation(rig: &Rig, deployment: &Deployment, args: &Args, nodes: &[Process]) {
    let all: Vec<&str> = deployment.nodes.iter().map(|n| n.name.as_str()).collect();
    let require = all.join(",");
    let mut serfs = serf_joined(rig, deployment, args, "starve");
    let mut run = guarded_run(rig, deployment, &require);
    for (k, &share) in args.shares.iter().enumerate() {
        let target = k % nodes.len();
        let quota = (share * 1_000.0).round() as u64;
        let before = serfs.first_mut().map(serf_failed);
        let held: Result<Vec<Starved>, String> = std::iter::once(nodes[target].pid())
            .chain(std::iter::once(
                serfs.get(target + 1).and_then(Process::pid),
            ))
            .flatten()
            .map(|pid| Starved::hold(pid, quota))
            .collect();
        let held = match held {
            Ok(held) => held,
            Err(why) => {
                eprintln!("starve: cannot hold a process to a share of a core: {why}");
                return;
            }
        };
        let started = Instant::now();
        let mut faults = 0u32;
        while started.elapsed() < args.starve {
            let left = args.starve.saturating_sub(started.elapsed());
            if let Some(fault) = run.wait_event(left, "run_faulted", &[]) {
                faults += 1;
                eprintln!("{share}% of a core for {}: {fault}", all[target]);
                run.wait_exit(Duration::from_secs(10));
                run.kill();
                run = guarded_run(rig, deployment, &require);
            }
        }
        drop(held);
        let failed = match (before, serfs.first_mut()) {
            (Some(before), Some(agent)) => Some(serf_failed(agent) - before),
            _ => None,
        };
        if failed.is_some_and(|f| f > 0) {
            serf_all_alive(rig, serfs.len(), Duration::from_secs(90));
        }
        line(
            args,
            "rig_starve_false_faults",
            serde_json::json!({
                "share_percent": share,
                "seconds": args.starve.as_secs(),
                "node": all[target],
                "false_faults": faults,
                "serf_member_failed": failed,
            }),
        );
    }
    run.kill();
}

/// With `--serf`, Serf agents beside the nodes, every one joined (or a
/// line saying how many did); none without.
fn serf_joined(rig: &Rig, deployment: &Deployment, args: &Args, what: &str) -> Vec<Process> {
    if !args.serf {
        return Vec::new();
    }
    let serfs = serf(rig, deployment);
    let alive = serf_all_alive(rig, serfs.len(), Duration::from_secs(60));
    if alive < serfs.len() {
        eprintln!("{what}: only {alive} of {} Serf agents joined", serfs.len());
    }
    serfs
}

/// Waits up to `limit` for host-1's Serf agent to see `count` members
/// alive; how many it sees.
fn serf_all_alive(rig: &Rig, count: usize, limit: Duration) -> usize {
    let deadline = Instant::now() + limit;
    while serf_alive(rig) < count && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(500));
    }
    serf_alive(rig)
}

fn loss(rig: &Rig, deployment: &Deployment, args: &Args, percent: u32) {
    let all: Vec<&str> = deployment.nodes.iter().map(|n| n.name.as_str()).collect();
    let require = all.join(",");
    let mut serfs = serf_joined(rig, deployment, args, &format!("loss {percent}%"));
    let serf_at_start = args.serf.then(|| serf_alive(rig));
    let mut run = guarded_run(rig, deployment, &require);
    for host in 0..rig.hosts.len() {
        rig.udp_loss(host, percent);
    }
    let span = Duration::from_secs_f64(args.minutes * 60.0);
    let started = Instant::now();
    let mut faults = 0u32;
    let mut first_fault_ms = None;
    let serf_seen_before = serfs.first_mut().map(serf_failed).unwrap_or(0);
    while started.elapsed() < span {
        let left = span.saturating_sub(started.elapsed());
        if let Some(fault) = run.wait_event(left, "run_faulted", &[]) {
            faults += 1;
            first_fault_ms.get_or_insert(started.elapsed().as_millis() as u64);
            eprintln!(
                "loss {percent}%: false fault at {:?}: {fault}",
                started.elapsed()
            );
            run.wait_exit(Duration::from_secs(10));
            run.kill();
            if started.elapsed() < span {
                run = guarded_run(rig, deployment, &require);
            }
        }
    }
    let serf_failed_events: Option<usize> = serfs
        .first_mut()
        .map(|orchestrators| serf_failed(orchestrators) - serf_seen_before);
    let serf_at_end = args.serf.then(|| serf_running(&mut serfs));
    for host in 0..rig.hosts.len() {
        rig.udp_loss(host, 0);
    }
    run.kill();
    for agent in &mut serfs {
        agent.kill();
    }
    line(
        args,
        "rig_loss_false_faults",
        serde_json::json!({
            "loss_percent": percent,
            "minutes": args.minutes,
            "false_faults": faults,
            "first_fault_ms": first_fault_ms,
            "serf_member_failed": serf_failed_events,
            "serf_agents": args.serf.then_some(serfs.len()),
            "serf_members_at_start": serf_at_start,
            "serf_agents_running_at_end": serf_at_end,
        }),
    );
}

/// How long the heartbeats' cost is measured.
const COST_SPAN: Duration = Duration::from_secs(30);

/// What the agent connections cost with a run guarded over every node:
/// bytes a second per node on the orchestrator's agent port (frames and
/// acknowledgements, headers included), beside SWIM's on its UDP port in
/// the same seconds (the baseline), and the orchestrator's CPU.
fn heartbeat_cost(rig: &Rig, deployment: &Deployment, args: &Args) {
    let all: Vec<&str> = deployment.nodes.iter().map(|n| n.name.as_str()).collect();
    let mut run = guarded_run(rig, deployment, &all.join(","));
    rig.nft(
        0,
        "table inet rig_count {\n\
         chain input { type filter hook input priority 0; policy accept; tcp dport 7947 counter; udp dport 7946 counter; }\n\
         chain output { type filter hook output priority 0; policy accept; tcp sport 7947 counter; udp sport 7946 counter; }\n\
         }\n",
    );
    let pid = run.pid().unwrap_or(0);
    let (cpu_before, started) = (cpu_ticks(pid), Instant::now());
    std::thread::sleep(COST_SPAN);
    let (cpu_after, seconds) = (cpu_ticks(pid), started.elapsed().as_secs_f64());
    let listed = rig
        .exec(0, &["nft", "list", "table", "inet", "rig_count"])
        .unwrap_or_default();
    let _ = rig.exec(0, &["nft", "delete", "table", "inet", "rig_count"]);
    // In rule order: agent in, SWIM in, agent out, SWIM out.
    let bytes: Vec<f64> = listed
        .split("bytes ")
        .skip(1)
        .filter_map(|rest| rest.split_whitespace().next()?.parse().ok())
        .collect();
    let per_node = |total: f64| (total / seconds / args.nodes as f64).round();
    let (agent, swim) = match bytes.as_slice() {
        [agent_in, swim_in, agent_out, swim_out] => {
            (per_node(agent_in + agent_out), per_node(swim_in + swim_out))
        }
        _ => (f64::NAN, f64::NAN),
    };
    // /proc reports CPU time in USER_HZ (100 a second on Linux).
    let cpu = (cpu_after - cpu_before) as f64 / 100.0 / seconds * 100.0;
    run.kill();
    line(
        args,
        "rig_heartbeat_cost",
        serde_json::json!({
            "seconds": (seconds * 10.0).round() / 10.0,
            "agent_bytes_per_s_per_node": agent,
            "swim_bytes_per_s_per_node": swim,
            "orchestrator_cpu_percent": (cpu * 100.0).round() / 100.0,
        }),
    );
}

/// A process's CPU time so far (user + system), in USER_HZ ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces), from field 3.
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let at = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    at(11) + at(12)
}

/// `member-failed` events a Serf agent logged so far (the agent beside
/// the orchestrator: the view an orchestrator on Serf would act on).
fn serf_failed(agent: &mut Process) -> usize {
    agent.drain();
    let mut text = agent.stderr();
    text.push_str(&agent.seen().join("\n"));
    text.matches("EventMemberFailed").count()
}

/// Replicas on etcd: the leading `watch` SIGKILLed `args.failovers` times,
/// each time restarted as the new follower.
fn failovers(args: &Args) {
    // host-1: etcd; host-2, host-3: replicas; then the node hosts.
    let Some(rig) = Rig::new(3 + args.hosts) else {
        std::process::exit(1);
    };
    let (_etcd, endpoint) = deploy::etcd_on(&rig, 0);
    let node_hosts: Vec<usize> = (0..args.nodes).map(|i| 3 + i % args.hosts).collect();
    let deployment = Deployment::write(
        &rig,
        &[1, 2],
        &node_hosts,
        Options {
            window: Some(args.window),
            orchestrator_extra: format!("[state]\netcd = [\"{endpoint}\"]\ninsecure = true\n"),
            ..Options::default()
        },
    );
    let _nodes = deployment.start_nodes(&rig);
    let mut hosts = (1, 2);
    let mut leader = deployment.replica(&rig, hosts.0, &["watch", "--json"]);
    if deploy::stderr_line(&leader, "this replica leads", READY).is_none() {
        panic!("no leader: {}", leader.stderr());
    }
    let mut follower = deployment.replica(&rig, hosts.1, &["watch", "--json"]);
    if leader.wait_event(READY, "pool_ready", &[]).is_none() {
        panic!("no pool_ready: {}", leader.stderr());
    }
    let (mut leads, mut frames, mut events, mut gaps) = (vec![], vec![], vec![], vec![]);
    let since = |at: std::time::SystemTime, from: std::time::SystemTime| {
        at.duration_since(from).unwrap_or_default().as_secs_f64() * 1000.0
    };
    for k in 0..args.failovers {
        if deploy::stderr_line(&follower, "replica started: campaigning", READY).is_none() {
            panic!("the follower did not start: {}", follower.stderr());
        }
        let killed_at = std::time::SystemTime::now();
        let killed = Instant::now();
        leader.kill();
        match follower.wait_event(READY, "pool_ready", &[]) {
            Some(_) => events.push(killed.elapsed().as_secs_f64() * 1000.0),
            None => eprintln!("failover {k}: no pool_ready within {READY:?}"),
        }
        let first = |message: &str| {
            deploy::logged_at(&follower, message)
                .into_iter()
                .find(|at| *at > killed_at)
                .map(|at| since(at, killed_at))
        };
        leads.extend(first("leading"));
        gaps.extend(first("leading: the orchestrator started"));
        frames.extend(first("agent connected: first frame accepted"));
        eprintln!(
            "failover {}/{}: leads {:?} ms, first frame {:?} ms, first event {:?} ms",
            k + 1,
            args.failovers,
            leads.last(),
            frames.last(),
            events.last()
        );
        hosts = (hosts.1, hosts.0);
        leader = follower;
        follower = deployment.replica(&rig, hosts.1, &["watch", "--json"]);
    }
    report(args, "rig_failover_leads_ms", &leads);
    report(args, "rig_failover_first_frame_ms", &frames);
    report(args, "rig_failover_first_event_ms", &events);
    report(args, "rig_failover_guard_gap_ms", &gaps);
}
