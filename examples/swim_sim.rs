//! Thousands of nodes, by simulation: N foca members in memory on a
//! virtual clock, the orchestrator's member feeding the real gate.
//!
//! ```text
//! cargo run --release --example swim_sim -- --nodes N [--loss P] [--seed S] [--crashes K] [--soak SECONDS] [--indirect-probes K] [--json]
//! ```
//!
//! One run, three parts, each figure a JSON line with `--json`:
//!
//! 1. Cold start: every member joins through the orchestrator's member,
//!    every agent announces within 1 s; window 5 s, lossless network.
//!    `sim_ready_ms`, with the time after the last announcement.
//! 2. Crashes (lossless): a run is committed over every node, a random
//!    node crashes, the time to `run_faulted` is measured, the node
//!    restarts (a new generation) and the pool is ready again; K times.
//!    `sim_fault_ms_p50`, `sim_fault_ms_p99`.
//! 3. Soak at `--loss` (default 1%): a run committed over every node, no
//!    crash, for `--soak` virtual seconds (default 600); every fault is a
//!    false one (the run is committed again once ready).
//!    `sim_false_faults` per virtual hour, `sim_false_suspicions` per
//!    node-hour (suspect facts in the orchestrator's view).
//!
//! `--converged` starts from a converged SWIM cluster (every member
//! already knows every other) instead of the cold start's joins, whose
//! gossip costs the simulation O(N³) at large N (foca finds a member by a
//! linear scan of its view); the first figure is then
//! `sim_ready_ms_converged`, and the rest are the steady state's.
//!
//! Throughout: `sim_tracker_ns_per_call` (real time of the SWIM adapter's
//! tracker per foca call of the orchestrator's member after the cold
//! start: the mean, which a call preempted by the OS can weigh on, and the
//! distribution's p50/p99/p99.9/max; beside it the old whole-view walk
//! timed on one call in 16, and the cold start's own figure, where every
//! call carries many changes; and, as a control, the p50 of a call with
//! nothing noted made right after each, with warm caches),
//! `sim_tracker_replayed_ns_per_call` (the same input again in a tight
//! loop, the fastest of five passes; then the calls that noted nothing
//! alone, per call, and the others alone, per state noted),
//! `sim_real_ms_per_virtual_s`, and the peak resident memory.

use std::time::Instant;

use poolgate_actors::core::Event;
use poolgate_sim::{SimSettings, Simulation};

struct Args {
    nodes: usize,
    loss: f64,
    seed: u64,
    crashes: usize,
    soak_s: u64,
    indirect_probes: usize,
    converged: bool,
    json: bool,
}

fn args() -> Result<Args, Box<dyn std::error::Error>> {
    let mut args = Args {
        nodes: 100,
        loss: 0.01,
        seed: 1,
        crashes: 50,
        soak_s: 600,
        indirect_probes: poolgate::live::swim::member::DEFAULT_INDIRECT_PROBES,
        converged: false,
        json: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--nodes" => args.nodes = it.next().ok_or("--nodes N")?.parse()?,
            "--loss" => args.loss = it.next().ok_or("--loss P")?.parse()?,
            "--seed" => args.seed = it.next().ok_or("--seed S")?.parse()?,
            "--crashes" => args.crashes = it.next().ok_or("--crashes K")?.parse()?,
            "--soak" => args.soak_s = it.next().ok_or("--soak SECONDS")?.parse()?,
            "--indirect-probes" => {
                args.indirect_probes = it.next().ok_or("--indirect-probes K")?.parse()?
            }
            "--converged" => args.converged = true,
            "--json" => args.json = true,
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    if !(0.0..1.0).contains(&args.loss) {
        return Err(format!("--loss must be in [0, 1), not {}", args.loss).into());
    }
    Ok(args)
}

/// One figure: a JSON line, or a line for people.
struct Out {
    json: bool,
    nodes: usize,
    seed: u64,
    indirect_probes: usize,
}

impl Out {
    fn figure(&self, metric: &str, loss: f64, value: f64, extra: &[(&str, f64)]) {
        if self.json {
            let mut line = format!(
                "{{\"metric\":\"{metric}\",\"nodes\":{},\"seed\":{},\"indirect_probes\":{},\"loss\":{loss}",
                self.nodes, self.seed, self.indirect_probes
            );
            for (key, v) in extra {
                line.push_str(&format!(",\"{key}\":{}", json_number(*v)));
            }
            line.push_str(&format!(",\"value\":{}}}", json_number(value)));
            println!("{line}");
        } else {
            let extra: Vec<String> = extra
                .iter()
                .map(|(k, v)| format!("{k} {}", round(*v)))
                .collect();
            println!("{metric:<28} {:>12}   {}", round(value), extra.join(", "));
        }
    }
}

/// A figure as a JSON number; `null` where there is none (no sample).
fn json_number(v: f64) -> String {
    if v.is_finite() {
        round(v).to_string()
    } else {
        "null".into()
    }
}

fn round(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    // Nearest rank.
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1] as f64
}

/// Nanoseconds per call, sorted for [`percentile`].
fn sorted_ns(ns: &[u32]) -> Vec<u64> {
    let mut sorted: Vec<u64> = ns.iter().map(|ns| u64::from(*ns)).collect();
    sorted.sort_unstable();
    sorted
}

fn peak_rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kib| kib / 1024.0)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = args()?;
    let out = Out {
        json: args.json,
        nodes: args.nodes,
        seed: args.seed,
        indirect_probes: args.indirect_probes,
    };
    let runtime = Simulation::runtime()?;
    let system = actix::System::with_tokio_rt(move || runtime);
    system.block_on(run(args, out))
}

async fn run(args: Args, out: Out) -> Result<(), Box<dyn std::error::Error>> {
    let mut settings = SimSettings::new(args.nodes, args.seed);
    settings.swim.indirect_probes = args.indirect_probes;
    settings.converged = args.converged;
    settings.time_tracker = true;
    let window_ms = settings.window.as_millis() as f64;
    let real = Instant::now();
    let mut sim = Simulation::start(settings).await?;

    // 1. Cold start, with a progress line on stderr every virtual second.
    let mut ready_ms = None;
    while ready_ms.is_none() && sim.now_ms() < 600_000 {
        let until = sim.now_ms() + 1_000;
        ready_ms = sim.until_ready(until).await?;
        eprintln!(
            "cold start: {} virtual ms after {:.1} s; the orchestrator's member knows {} members",
            sim.now_ms(),
            real.elapsed().as_secs_f64(),
            sim.network().active_members(0)
        );
    }
    let ready_ms = ready_ms.ok_or("no PoolReady within 600 virtual seconds")?;
    let after_last = ready_ms.saturating_sub(sim.last_announce_ms());
    // From a converged cluster the figure says nothing of a cold start.
    let metric = if args.converged {
        "sim_ready_ms_converged"
    } else {
        "sim_ready_ms"
    };
    out.figure(
        metric,
        0.0,
        ready_ms as f64,
        &[
            ("window_ms", window_ms),
            ("after_last_announce_ms", after_last as f64),
        ],
    );

    let cold = sim.network().stats().clone();

    // 2. Crashes.
    let mut delays = Vec::with_capacity(args.crashes);
    let (mut missed, mut wrong) = (0u64, 0u64);
    for _ in 0..args.crashes {
        sim.commit_all().await?;
        // Crash somewhere in the next probe periods, not at commit.
        let settle = sim.now_ms() + 1_000;
        sim.run_until(settle, |_| false).await?;
        let limit = sim.now_ms() + 60_000;
        let crash = sim.crash_one(limit).await?;
        match crash.faulted {
            Some((node, at)) => {
                if node != crash.node {
                    wrong += 1;
                }
                delays.push(at - crash.at_ms);
                eprintln!(
                    "crash {} of {}: {} at {} ms → run_faulted {} ms later ({:.1} s real so far)",
                    delays.len(),
                    args.crashes,
                    crash.node,
                    crash.at_ms,
                    at - crash.at_ms,
                    real.elapsed().as_secs_f64()
                );
            }
            None => missed += 1,
        }
        let limit = sim.now_ms() + 120_000;
        sim.until_ready(limit)
            .await?
            .ok_or("the pool was not ready again after a restart")?;
        eprintln!(
            "ready again at {} virtual ms ({:.1} s real so far)",
            sim.now_ms(),
            real.elapsed().as_secs_f64()
        );
    }
    delays.sort_unstable();
    let crashes = [
        ("crashes", args.crashes as f64),
        ("missed", missed as f64),
        ("wrong_node", wrong as f64),
    ];
    out.figure("sim_fault_ms_p50", 0.0, percentile(&delays, 50.0), &crashes);
    out.figure("sim_fault_ms_p99", 0.0, percentile(&delays, 99.0), &crashes);
    out.figure(
        "sim_fault_ms_max",
        0.0,
        percentile(&delays, 100.0),
        &crashes,
    );

    // 3. Soak at the given loss.
    sim.network().set_loss(args.loss);
    let suspicions_before = sim.suspicions();
    let soak_from = sim.now_ms();
    let soak_until = soak_from + args.soak_s * 1_000;
    let mut faults = 0u64;
    let mut exposed_ms = 0u64;
    while sim.now_ms() < soak_until {
        let committed_at = sim.now_ms();
        let run = sim.commit_all().await?;
        let fault = sim
            .run_until(
                soak_until,
                |e| matches!(e, Event::RunFaulted { run: r, .. } if *r == run),
            )
            .await?;
        exposed_ms += sim.now_ms() - committed_at;
        if fault.is_none() {
            break;
        }
        faults += 1;
        if sim.until_ready(soak_until).await?.is_none() {
            break;
        }
    }
    let soak_h = (sim.now_ms() - soak_from) as f64 / 3_600_000.0;
    let exposed_h = exposed_ms as f64 / 3_600_000.0;
    let suspicions = sim.suspicions() - suspicions_before;
    out.figure(
        "sim_false_faults",
        args.loss,
        faults as f64 / exposed_h.max(f64::MIN_POSITIVE),
        &[
            ("faults", faults as f64),
            ("run_hours", exposed_h),
            ("virtual_s", soak_h * 3600.0),
        ],
    );
    out.figure(
        "sim_false_suspicions",
        args.loss,
        suspicions as f64 / (soak_h * args.nodes as f64).max(f64::MIN_POSITIVE),
        &[
            ("suspicions", suspicions as f64),
            ("node_hours", soak_h * args.nodes as f64),
        ],
    );

    // Costs.
    let stats = sim.network().stats().clone();
    let ns = |total: u64, calls: u64| total as f64 / calls.max(1) as f64;
    // After the cold start (crashes, restarts, soak): the steady state.
    let calls = stats.tracker_calls - cold.tracker_calls;
    let cold_calls = usize::try_from(cold.tracker_calls).unwrap_or(usize::MAX);
    let network = sim.network();
    let all_calls = network.tracker_call_ns();
    let (cold_ns, steady_ns) = all_calls.split_at(cold_calls.min(all_calls.len()));
    let per_call = sorted_ns(steady_ns);
    let again = sorted_ns(
        network
            .tracker_again_ns()
            .get(cold_calls..)
            .unwrap_or_default(),
    );
    out.figure(
        "sim_tracker_ns_per_call",
        args.loss,
        ns(per_call.iter().sum(), calls),
        &[
            ("calls", calls as f64),
            ("p50_ns", percentile(&per_call, 50.0)),
            ("p99_ns", percentile(&per_call, 99.0)),
            ("p999_ns", percentile(&per_call, 99.9)),
            ("max_ns", percentile(&per_call, 100.0)),
            ("nothing_noted_again_p50_ns", percentile(&again, 50.0)),
            (
                "noted_per_call",
                (stats.noted - cold.noted) as f64 / calls.max(1) as f64,
            ),
            (
                "whole_view_walk_ns_per_call",
                ns(
                    stats.baseline_ns - cold.baseline_ns,
                    stats.baseline_calls - cold.baseline_calls,
                ),
            ),
            (
                "cold_start_ns_per_call",
                ns(
                    cold_ns.iter().map(|ns| u64::from(*ns)).sum(),
                    cold.tracker_calls,
                ),
            ),
            (
                "cold_start_noted_per_call",
                cold.noted as f64 / cold.tracker_calls.max(1) as f64,
            ),
        ],
    );
    if let Some(replay) = sim.network().replay_tracker(cold.tracker_calls) {
        out.figure(
            "sim_tracker_replayed_ns_per_call",
            args.loss,
            ns(replay.ns, replay.calls),
            &[
                ("calls", replay.calls as f64),
                ("nothing_noted_calls", replay.idle_calls as f64),
                (
                    "nothing_noted_ns_per_call",
                    ns(replay.idle_ns, replay.idle_calls),
                ),
                ("noted_calls", replay.busy_calls as f64),
                ("noted_states", replay.busy_states as f64),
                ("updates", replay.updates as f64),
                ("noted_ns_per_state", ns(replay.busy_ns, replay.busy_states)),
            ],
        );
    }
    let virtual_s = sim.now_ms() as f64 / 1_000.0;
    let real_ms = real.elapsed().as_secs_f64() * 1_000.0;
    out.figure(
        "sim_real_ms_per_virtual_s",
        args.loss,
        real_ms / virtual_s,
        &[
            ("virtual_s", virtual_s),
            ("datagrams", stats.sent as f64),
            ("lost", stats.lost as f64),
        ],
    );
    out.figure("sim_peak_rss_mib", args.loss, peak_rss_mib(), &[]);
    Ok(())
}
