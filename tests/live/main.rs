//! The live cluster for real: `poolgate node` processes of the built binary
//! on 127.0.0.1 (sealed SWIM over UDP, signed announcements over TCP), the
//! orchestrator in this test process or as `poolgate run`/`watch`, crashes
//! by SIGKILL; one with a real etcd on 127.0.0.1 (replicas, design §12).
//! Each test gives up after 40 s; every process it started is killed and
//! reaped when its cluster is dropped. Beside them: nobody gets in who
//! does not belong (`security.rs`), and the command dies with its guard
//! (`guard.rs`).
//!
//! One test binary for these (each is linked once).

#[path = "../common/mod.rs"]
mod common;
#[path = "../common/etcd.rs"]
#[macro_use]
mod etcd;

mod guard;
mod security;

use std::process::Stdio;
use std::time::Duration;

use common::live::{live_for, ready, until};
use common::node;
use nix::sys::signal::Signal;
use poolgate::cli::cluster::{ClusterPlan, LocalCluster};
use poolgate::core::{Epoch, Event, Reason, RunId};
use poolgate::{EventStream, Gate};
use tokio::io::{AsyncBufReadExt, BufReader};

const BASE: &str = r#"
[pool]
id = "live"
members = ["unused"]
[readiness]
convergence_window = "300ms"
[planning]
on_readiness_lost = "wait"
[swim]
probe_period = "200ms"
probe_rtt = "60ms"
suspicion_timeout = "1s"
"#;

/// One pool of the nodes started, a 300 ms window, `wait`: no `[swim]`
/// timings (the default profile), or a test's own after it.
const POOL: &str = r#"
[pool]
id = "live"
members = ["unused"]
[readiness]
convergence_window = "300ms"
[planning]
on_readiness_lost = "wait"
"#;

const LIMIT: Duration = Duration::from_secs(40);

fn plan(nodes: u32) -> ClusterPlan {
    common::live::plan(BASE, nodes)
}

fn live<F: std::future::Future<Output = ()>>(test: F) {
    live_for(LIMIT, test);
}

async fn start(plan: &ClusterPlan) -> (LocalCluster, Gate, EventStream) {
    let mut cluster = LocalCluster::prepare(plan).await.unwrap();
    let gate = cluster.orchestrator().unwrap().gate.clone();
    let events = gate.subscribe();
    for i in 0..cluster.nodes.len() {
        cluster.spawn(i).unwrap();
    }
    (cluster, gate, events)
}

/// Run `run` planned and committed on `gate` at `epoch` over `required`.
async fn committed(gate: &Gate, run: &str, epoch: Epoch, required: &[&str]) -> RunId {
    let run = RunId::new(run).unwrap();
    gate.begin_planning(run.clone(), Some(epoch)).await.unwrap();
    let required = required.iter().map(|n| node(n)).collect();
    gate.commit_plan(run.clone(), required, Some(epoch))
        .await
        .unwrap();
    run
}

#[test]
fn node_processes_form_the_pool_a_sigterm_is_left_and_a_sigkill_faults_the_run() {
    live(async {
        let (mut cluster, gate, mut events) = start(&plan(4)).await;
        let epoch = ready(&mut events).await;
        let run = committed(&gate, "r1", epoch, &["node-1", "node-2"]).await;

        // A graceful stop of a node the run does not require: `left`.
        cluster.signal(3, Signal::SIGTERM);
        let lost = until(&mut events, |e| match e {
            Event::ReadinessLost {
                node: Some(n),
                reason,
                ..
            } => Some((n.clone(), *reason)),
            Event::RunFaulted { .. } => panic!("the run faulted on a node it does not require"),
            _ => None,
        })
        .await;
        assert_eq!(lost, (node("node-4"), Reason::Left));
        assert_eq!(cluster.wait_exit(3, Duration::from_secs(5)).await, Some(0));

        // A crash of a required node faults the run.
        cluster.kill(1);
        let faulted = until(&mut events, |e| match e {
            Event::RunFaulted {
                run: r,
                node,
                reason,
                ..
            } if *r == run => Some((node.clone(), *reason)),
            _ => None,
        })
        .await;
        assert_eq!(faulted.0, node("node-2"));
        assert!(
            // The closed agent connection (after its grace) or SWIM's
            // suspicion, whichever comes first.
            matches!(
                faulted.1,
                Reason::Unavailable | Reason::Suspect | Reason::Dead
            ),
            "{faulted:?}"
        );
    });
}

#[test]
fn a_killed_node_restarted_on_a_new_port_is_alive_again_and_the_pool_reaches_a_new_epoch() {
    live(async {
        let (mut cluster, _gate, mut events) = start(&plan(3)).await;
        assert_eq!(ready(&mut events).await, Epoch(1));
        cluster.kill(0);
        until(&mut events, |e| match e {
            Event::ReadinessLost { node: Some(n), .. } if *n == node("node-1") => Some(()),
            _ => None,
        })
        .await;
        cluster.spawn(0).unwrap();
        assert_eq!(ready(&mut events).await, Epoch(2));
    });
}

#[test]
fn a_failing_health_check_faults_with_its_stderr_and_a_new_identity_on_sighup_is_a_change() {
    let sick = std::env::temp_dir().join(format!("poolgate-sick-{}", std::process::id()));
    let _ = std::fs::remove_file(&sick);
    let mut plan = plan(2);
    plan.health_check = Some(vec![
        "sh".into(),
        "-c".into(),
        format!(
            "if [ -e '{}' ]; then echo warming up >&2; echo disk on fire >&2; exit 1; fi",
            sick.display()
        ),
    ]);
    live(async {
        let (cluster, gate, mut events) = start(&plan).await;
        assert_eq!(ready(&mut events).await, Epoch(1));
        std::fs::write(&sick, "").unwrap();
        let lost = until(&mut events, |e| match e {
            Event::ReadinessLost { reason, .. } => Some(*reason),
            _ => None,
        })
        .await;
        assert_eq!(lost, Reason::Faulted);
        // Both nodes' checks fault within a few of their periods; each
        // then says why.
        let faulted = |report: &poolgate::core::PoolReport| {
            report.candidates.iter().all(|c| c.detail.fault.is_some())
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let mut report = gate.report().await.unwrap();
        while !faulted(&report) && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
            report = gate.report().await.unwrap();
        }
        for candidate in &report.candidates {
            assert_eq!(
                candidate.detail.fault.as_deref(),
                Some("disk on fire"),
                "{}",
                candidate.node
            );
        }
        std::fs::remove_file(&sick).unwrap();
        assert_eq!(ready(&mut events).await, Epoch(2));

        // A new identity file, read again on SIGHUP.
        std::fs::write(&cluster.nodes[0].identity, b"a rotated data-plane key").unwrap();
        cluster.signal(0, Signal::SIGHUP);
        let lost = until(&mut events, |e| match e {
            Event::ReadinessLost {
                node: Some(n),
                reason,
                ..
            } => Some((n.clone(), *reason)),
            _ => None,
        })
        .await;
        assert_eq!(lost, (node("node-1"), Reason::IdentityChanged));
    });
    let _ = std::fs::remove_file(&sick);
}

#[test]
fn a_restarted_orchestrator_hears_the_running_nodes_again() {
    live(async {
        let (mut cluster, _gate, mut events) = start(&plan(3)).await;
        ready(&mut events).await;
        let restarted = cluster.restart_orchestrator().await.unwrap();
        let mut events = restarted.gate.subscribe();
        // Memory only: the new gate counts epochs from 1.
        assert_eq!(ready(&mut events).await, Epoch(1));
    });
}

/// `poolgate run --json --require REQUIRE` on the cluster's
/// orchestrator.toml, guarding a command that writes its pid to the file
/// returned, then sleeps.
fn poolgate_run(
    cluster: &LocalCluster,
    require: &str,
) -> (tokio::process::Child, std::path::PathBuf) {
    let pid_file = cluster.dir.join("command.pid");
    let run = tokio::process::Command::new(env!("CARGO_BIN_EXE_poolgate"))
        .arg("run")
        .arg("--config")
        .arg(&cluster.config_file)
        .args(["--json", "--require", require, "--", "sh", "-c"])
        .arg(format!("echo $$ > '{}'; exec sleep 60", pid_file.display()))
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    (run, pid_file)
}

/// Reads `poolgate run`'s or `watch`'s JSON lines until `pick` accepts one.
async fn until_line(
    lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    mut pick: impl FnMut(&serde_json::Value) -> bool,
) -> serde_json::Value {
    while let Some(line) = lines.next_line().await.unwrap() {
        let value: serde_json::Value = serde_json::from_str(&line).unwrap();
        if pick(&value) {
            return value;
        }
    }
    panic!("the output ended first");
}

#[test]
fn poolgate_run_commits_guards_its_command_and_exits_3_when_a_required_node_is_killed() {
    let mut plan = plan(3);
    plan.external_orchestrator = true;
    live(async {
        let mut cluster = LocalCluster::prepare(&plan).await.unwrap();
        for i in 0..cluster.nodes.len() {
            cluster.spawn(i).unwrap();
        }
        let (mut run, pid_file) = poolgate_run(&cluster, "node-1,node-2");
        let mut lines = BufReader::new(run.stdout.take().unwrap()).lines();
        let committed = until_line(&mut lines, |v| v["event"] == "run_committed").await;
        assert_eq!(
            committed["required"],
            serde_json::json!(["node-1", "node-2"])
        );
        // The command is running; then a required node crashes.
        let command_pid: i32 = loop {
            match std::fs::read_to_string(&pid_file) {
                Ok(text) if !text.trim().is_empty() => break text.trim().parse().unwrap(),
                _ => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        };
        cluster.kill(1);
        let faulted = until_line(&mut lines, |v| v["event"] == "run_faulted").await;
        assert_eq!(faulted["node"], "node-2");
        let status = exited(&mut run).await;
        assert_eq!(status.code(), Some(3));
        let alive = nix::sys::signal::kill(nix::unistd::Pid::from_raw(command_pid), None).is_ok();
        assert!(!alive, "the guarded command is gone");
    });
}

#[test]
fn poolgate_watch_until_ready_exits_0_at_pool_ready_and_1_at_its_timeout() {
    let mut plan = plan(2);
    plan.external_orchestrator = true;
    live(async {
        let mut cluster = LocalCluster::prepare(&plan).await.unwrap();
        let config_file = cluster.config_file.clone();
        let until_ready = |timeout: &str| {
            let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_poolgate"));
            command
                .arg("watch")
                .arg("--config")
                .arg(&config_file)
                .args(["--json", "--until-ready", "--timeout", timeout])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .kill_on_drop(true);
            command
        };
        let watch = |timeout: &str| until_ready(timeout).output();
        // No node runs: no PoolReady before the timeout.
        let early = watch("1s").await.unwrap();
        assert_eq!(early.status.code(), Some(1));
        // Stopped before the pool is ready: not the answer asked for
        // (an operator's trial: `timeout 30 poolgate watch --until-ready
        // ... && next` read a SIGTERM as "ready").
        let stopped = until_ready("60s").spawn().unwrap();
        // Up once its agent listener answers (its signals are taken first).
        while tokio::net::TcpStream::connect(cluster.config.agents.listen)
            .await
            .is_err()
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let pid = nix::unistd::Pid::from_raw(stopped.id().unwrap() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        let stopped = stopped.wait_with_output().await.unwrap();
        let said = String::from_utf8_lossy(&stopped.stderr);
        assert_eq!(stopped.status.code(), Some(1), "{said}");
        assert!(said.contains("stopped before the pool was ready"), "{said}");
        for i in 0..cluster.nodes.len() {
            cluster.spawn(i).unwrap();
        }
        let output = watch("30s").await.unwrap();
        assert_eq!(output.status.code(), Some(0));
        let last = String::from_utf8(output.stdout).unwrap();
        let last: serde_json::Value = serde_json::from_str(last.lines().last().unwrap()).unwrap();
        assert_eq!(last["event"], "pool_ready");
    });
}

/// `method path` asked of `addr` once it answers: the status code and
/// the body.
async fn http(addr: std::net::SocketAddr, method: &str, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    loop {
        let Ok(mut stream) = tokio::net::TcpStream::connect(addr).await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let request = format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        let code = response
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or_else(|| panic!("not an HTTP answer: {response:?}"));
        let body = response
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_string())
            .unwrap_or_default();
        return (code, body);
    }
}

fn free_port() -> std::net::SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// Design §15: `--metrics` serves the metrics, a health check, a
/// readiness check (a lone orchestrator leads) and the status answer;
/// any other path is 404 (before: the metrics, 200, on every path).
#[test]
fn watch_serves_its_metrics_health_readiness_and_status_and_404_elsewhere() {
    let mut plan = plan(1);
    plan.external_orchestrator = true;
    live(async {
        let cluster = LocalCluster::prepare(&plan).await.unwrap();
        let port = free_port();
        let mut watch = tokio::process::Command::new(env!("CARGO_BIN_EXE_poolgate"))
            .arg("watch")
            .arg("--config")
            .arg(&cluster.config_file)
            .args(["--json", "--timeout", "20s", "--metrics"])
            .arg(port.to_string())
            .stdout(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let text = loop {
            let (code, text) = http(port, "GET", "/metrics").await;
            assert_eq!(code, 200, "{text}");
            if text.contains("poolgate_node_ready") {
                break text;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert!(text.contains("poolgate_candidates_blocked"), "{text}");
        // Per pool member, 0 while its node process has not started.
        assert!(
            text.lines().any(
                |l| l.starts_with("poolgate_node_ready{node=\"node-1\",pool=")
                    && l.ends_with("} 0")
            ),
            "{text}"
        );
        // Leadership and the pool's phase, as gauges.
        assert!(text.lines().any(|l| l == "poolgate_leading 1"), "{text}");
        assert!(
            text.lines().any(|l| l.starts_with("poolgate_pool_phase{")
                && l.contains("phase=\"forming\"")
                && l.ends_with(" 1")),
            "{text}"
        );
        assert_eq!(http(port, "GET", "/healthz").await, (200, "ok\n".into()));
        let (code, why) = http(port, "GET", "/readyz").await;
        assert_eq!(code, 200, "a lone orchestrator leads: {why}");
        let (code, status) = http(port, "GET", "/status").await;
        assert_eq!(code, 200, "{status}");
        let status: serde_json::Value = serde_json::from_str(&status).unwrap();
        assert_eq!(status["phase"], "forming", "{status}");
        assert_eq!(status["candidates"][0]["node"], "node-1", "{status}");
        assert_eq!(status["candidates"][0]["ready"], false, "{status}");
        for path in ["/", "/metricsx", "/healthz/", "/favicon.ico"] {
            assert_eq!(http(port, "GET", path).await.0, 404, "{path}");
        }
        assert_eq!(http(port, "POST", "/metrics").await.0, 405);
        let (code, body) = http(port, "HEAD", "/healthz").await;
        assert_eq!((code, body.as_str()), (200, ""));
        // A hundred idle connections (a slowloris; an operator's finding:
        // 32 kept every probe out) do not keep a probe out.
        let mut idle = Vec::new();
        for _ in 0..100 {
            idle.push(tokio::net::TcpStream::connect(port).await.unwrap());
        }
        let probe = tokio::time::timeout(Duration::from_secs(2), http(port, "GET", "/healthz"))
            .await
            .expect("a probe answered beside 100 idle connections");
        assert_eq!(probe.0, 200);
        drop(idle);
        watch.kill().await.unwrap();
    });
}

/// Design §15: a node agent's `--metrics`: `/readyz` is 503 while no
/// orchestrator has accepted its frames and 200 once one has; `/status`
/// says which orchestrator.
#[test]
fn a_node_agent_serves_its_readiness_by_its_orchestrator_connection() {
    let mut plan = plan(1);
    plan.external_orchestrator = true;
    live(async {
        let cluster = LocalCluster::prepare(&plan).await.unwrap();
        let port = free_port();
        let mut node = tokio::process::Command::new(env!("CARGO_BIN_EXE_poolgate"))
            .arg("node")
            .arg("--config")
            .arg(&cluster.nodes[0].config)
            .arg("--metrics")
            .arg(port.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        assert_eq!(http(port, "GET", "/healthz").await.0, 200);
        let (code, why) = http(port, "GET", "/readyz").await;
        assert_eq!(code, 503, "no orchestrator runs yet: {why}");
        let (_, status) = http(port, "GET", "/status").await;
        let status: serde_json::Value = serde_json::from_str(&status).unwrap();
        assert_eq!(status["node"], "node-1", "{status}");
        assert_eq!(status["connected"], false, "{status}");
        let mut watch = tokio::process::Command::new(env!("CARGO_BIN_EXE_poolgate"))
            .arg("watch")
            .arg("--config")
            .arg(&cluster.config_file)
            .args(["--json", "--until-ready", "--timeout", "20s"])
            .stdout(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let ready = tokio::time::timeout(Duration::from_secs(20), async {
            loop {
                let (code, why) = http(port, "GET", "/readyz").await;
                if code == 200 {
                    return why;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await
        .expect("the node's /readyz turns 200 once an orchestrator accepts it");
        assert!(
            ready.contains(&cluster.config.agents.listen.port().to_string()),
            "{ready}"
        );
        let (_, text) = http(port, "GET", "/metrics").await;
        assert!(
            text.lines().any(|l| l == "poolgate_agent_connected 1"),
            "{text}"
        );
        assert!(text.contains("poolgate_agent_frames_acked_total"), "{text}");
        assert_eq!(http(port, "GET", "/nowhere").await.0, 404);
        watch.kill().await.unwrap();
        node.kill().await.unwrap();
    });
}

/// Node processes a demo started, found by the folder in their command line.
fn processes_of(demo: u32) -> usize {
    let needle = format!("poolgate-cluster-{demo}-");
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|entry| std::fs::read(entry.ok()?.path().join("cmdline")).ok())
        .filter(|cmdline| String::from_utf8_lossy(cmdline).contains(&needle))
        .count()
}

#[test]
fn an_interrupted_demo_reaps_every_node_process() {
    live(async {
        let mut demo = tokio::process::Command::new(env!("CARGO_BIN_EXE_poolgate"))
            .args(["demo", "--json", "--nodes", "4", "--config"])
            .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/config.toml"))
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let pid = demo.id().unwrap();
        let mut lines = BufReader::new(demo.stdout.take().unwrap()).lines();
        // Once the pool is ready, every node process is running.
        until_line(&mut lines, |v| v["event"] == "pool_ready").await;
        assert_eq!(processes_of(pid), 4);
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), Signal::SIGINT).unwrap();
        let status = demo.wait().await.unwrap();
        assert_eq!(status.code(), Some(2), "an interrupted demo is an error");
        assert_eq!(processes_of(pid), 0, "no node process is left behind");
    });
}

#[test]
fn an_orchestrator_killed_right_after_a_commit_continues_its_epochs_and_guards_the_run() {
    live(async {
        let mut restarted = killed_after_a_commit_then_watched(|_| {}).await;
        let ready = until_line(&mut restarted.lines, |v| v["event"] == "pool_ready").await;
        assert!(ready["epoch"].as_u64().unwrap() > restarted.committed["epoch"].as_u64().unwrap());
        restarted.cluster.kill(0);
        let faulted = until_line(&mut restarted.lines, |v| v["event"] == "run_faulted").await;
        assert_eq!(faulted["run"], restarted.committed["run"]);
        assert_eq!(faulted["node"], "node-1");
        restarted.end().await;
    });
}

#[test]
fn a_required_node_restarted_while_its_orchestrator_was_down_faults_the_restored_run() {
    // Nobody heard node-1's first process go: its new process's first
    // frame is of another life than the state file holds.
    live(async {
        let mut restarted = killed_after_a_commit_then_watched(|cluster| {
            cluster.kill(0);
            cluster.spawn(0).unwrap();
        })
        .await;
        let faulted = until_line(&mut restarted.lines, |v| v["event"] == "run_faulted").await;
        assert_eq!(faulted["run"], restarted.committed["run"]);
        assert_eq!(
            (faulted["node"].as_str(), faulted["reason"].as_str()),
            (Some("node-1"), Some("faulted"))
        );
        assert!(
            faulted["at_ms"].as_u64().unwrap() < 20_000,
            "before the restore grace ends: {faulted}"
        );
        restarted.end().await;
    });
}

/// An orchestrator restarted on its state file after a crash.
struct Restarted {
    cluster: LocalCluster,
    watch: tokio::process::Child,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    /// The run it committed before the crash (its `run_committed`).
    committed: serde_json::Value,
    state_dir: std::path::PathBuf,
}

impl Restarted {
    async fn end(mut self) {
        self.watch.kill().await.unwrap();
        let _ = std::fs::remove_dir_all(&self.state_dir);
    }
}

/// Two nodes and a `run` over node-1 with a state file (restore grace
/// 20 s), SIGKILLed (and its guarded command) once the run is committed;
/// `between` is done to the cluster while no orchestrator runs; then a
/// `watch` started on the same state, its events read as they come.
async fn killed_after_a_commit_then_watched(between: impl FnOnce(&mut LocalCluster)) -> Restarted {
    let mut plan = plan(2);
    plan.external_orchestrator = true;
    let state_dir = std::env::temp_dir().join(format!(
        "poolgate-restart-{}-{}",
        std::process::id(),
        NEXT_DIR.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&state_dir).unwrap();
    plan.base.state.path = Some(state_dir.join("state.db"));
    plan.base.state.restore_grace = Duration::from_secs(20);
    let mut cluster = LocalCluster::prepare(&plan).await.unwrap();
    for i in 0..cluster.nodes.len() {
        cluster.spawn(i).unwrap();
    }
    let (mut run, pid_file) = poolgate_run(&cluster, "node-1");
    let mut lines = BufReader::new(run.stdout.take().unwrap()).lines();
    let committed = until_line(&mut lines, |v| v["event"] == "run_committed").await;
    // The node's frames are in the state file: written every 100 ms, and
    // the pool was ready only after its 300 ms window.
    // The orchestrator dies at once; its guarded command is orphaned.
    run.kill().await.unwrap();
    let _ = run.wait().await;
    if let Ok(pid) = std::fs::read_to_string(&pid_file) {
        if let Ok(pid) = pid.trim().parse::<i32>() {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
    between(&mut cluster);
    let mut watch = tokio::process::Command::new(env!("CARGO_BIN_EXE_poolgate"))
        .arg("watch")
        .arg("--config")
        .arg(&cluster.config_file)
        .args(["--json", "--timeout", "30s"])
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let lines = BufReader::new(watch.stdout.take().unwrap()).lines();
    Restarted {
        cluster,
        watch,
        lines,
        committed,
        state_dir,
    }
}

static NEXT_DIR: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

#[test]
fn start_errors_name_the_socket_and_the_address_or_the_key() {
    let dir = std::env::temp_dir().join(format!("poolgate-bind-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let config = dir.join("config.toml");
    let write = |swim: &str| {
        std::fs::write(
            &config,
            format!(
                "[pool]\nid = \"p\"\nmembers = [\"n1\"]\n[readiness]\nconvergence_window = \"1s\"\n\
                 [swim]\n{swim}\ninsecure = true\n[agents]\nlisten = \"127.0.0.1:{port}\"\n"
            ),
        )
        .unwrap();
    };
    let start = || {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_poolgate"))
            .args(["watch", "--timeout", "1s", "--config"])
            .arg(&config)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    // The agent port is taken.
    write("bind = \"127.0.0.1:0\"");
    let (code, stderr) = start();
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!("agent listener (TCP) socket on 127.0.0.1:{port}")),
        "{stderr}"
    );
    // Bound to every address, with nothing to advertise.
    write("bind = \"0.0.0.0:0\"");
    let (code, stderr) = start();
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("swim.advertise"), "{stderr}");
    // `run --timeout` with no node running: exit 1, saying what blocks.
    write("bind = \"127.0.0.1:0\"");
    drop(taken);
    let run_for_1s = |format: &str| {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_poolgate"))
            .args(["--log-format", format, "run", "--timeout", "1s", "--config"])
            .arg(&config)
            .args(["--", "true"])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        assert_eq!(output.status.code(), Some(1), "{stderr}");
        stderr
    };
    let what_blocks = |said: &str| said.contains("not ready within 1s") && said.contains("n1");
    let stderr = run_for_1s("text");
    assert!(what_blocks(&stderr), "{stderr}");
    // The same under `--log-format json`: every line of stderr a JSON
    // object, the command's answer among them (it was plain text amid the
    // JSON log, an operator's trial).
    let stderr = run_for_1s("json");
    let lines: Vec<serde_json::Value> = stderr
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert!(
        lines
            .iter()
            .any(|l| l["level"] == "WARN"
                && l["fields"]["message"].as_str().is_some_and(what_blocks)),
        "{stderr}"
    );
    // A signal while the run waits ends it, saying so (it exited 143 in
    // silence, an operator's trial).
    let said = dir.join("waiting.log");
    let mut waiting = std::process::Command::new(env!("CARGO_BIN_EXE_poolgate"))
        .args(["run", "--timeout", "60s", "--config"])
        .arg(&config)
        .args(["--", "true"])
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stderr(std::fs::File::create(&said).unwrap())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !std::fs::read_to_string(&said)
        .unwrap_or_default()
        .contains("orchestrator started")
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    let pid = nix::unistd::Pid::from_raw(waiting.id() as i32);
    let _ = nix::sys::signal::kill(pid, Signal::SIGTERM);
    let status = waiting.wait().unwrap();
    let stderr = std::fs::read_to_string(&said).unwrap_or_default();
    assert_eq!(status.code(), Some(143), "{stderr}");
    assert!(
        stderr.contains("was not committed: stopped by signal 15 while it waited"),
        "{stderr}"
    );
    // A hostname that does not resolve.
    write("bind = \"0.0.0.0:0\"\nadvertise = \"no-such-host.invalid:7946\"");
    let (code, stderr) = start();
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("swim.advertise") && stderr.contains("no-such-host.invalid"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn registry_entries_added_and_removed_at_runtime_take_effect_without_a_restart() {
    // Issue 21: an orchestrator started without node-2 in its registry
    // refuses node-2's frames; registered at runtime, node-2 counts and the
    // pool is ready; unregistered, it is forgotten (a committed run
    // requiring it faults) and blocked as unknown again.
    let mut plan = plan(2);
    plan.external_orchestrator = true;
    live(async {
        let mut cluster = LocalCluster::prepare(&plan).await.unwrap();
        let mut config = cluster.config.clone();
        let node2 = node("node-2");
        let key = config.registry.remove(&node2).expect("node-2's key");
        // Keys from bytes: the cluster key given in code, not as a file.
        let file = config.swim.cluster_keys.remove(0);
        config.swim.cluster_key_material =
            vec![poolgate::live::keys::ClusterKey::load(&file).unwrap()];
        let live = poolgate::live::Orchestrator::start(&config).await.unwrap();
        let mut events = live.gate.subscribe();
        for i in 0..cluster.nodes.len() {
            cluster.spawn(i).unwrap();
        }
        // node-1 is ready; node-2 is refused (never known).
        let blocked = |report: &poolgate::core::PoolReport| {
            report
                .candidates
                .iter()
                .find(|c| c.node == node2)
                .map(|c| c.blockers_in_words())
                .unwrap_or_default()
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let report = live.gate.report().await.unwrap();
            let node1_ready = report
                .candidates
                .iter()
                .any(|c| c.node == node("node-1") && c.verdict.is_ready());
            if node1_ready {
                assert!(blocked(&report).contains("unknown"), "{}", blocked(&report));
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "node-1 never ready");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(!live.registered().contains_key(&node2));

        live.register(node2.clone(), key).await.unwrap();
        assert_eq!(live.registered().get(&node2), Some(&key));
        let epoch = ready(&mut events).await;
        let run = RunId::new("needs-node-2").unwrap();
        live.gate
            .begin_planning(run.clone(), Some(epoch))
            .await
            .unwrap();
        live.gate
            .commit_plan(run.clone(), vec![node2.clone()], Some(epoch))
            .await
            .unwrap();

        live.unregister(&node2).await.unwrap();
        let faulted = until(&mut events, |e| match e {
            Event::RunFaulted { run: r, node, .. } if *r == run => Some(node.clone()),
            _ => None,
        })
        .await;
        assert_eq!(faulted, node2);
        let report = live.gate.report().await.unwrap();
        assert!(blocked(&report).contains("unknown"), "{}", blocked(&report));
        // Forgetting again changes nothing.
        live.unregister(&node2).await.unwrap();
        assert!(!live.registered().contains_key(&node2));
        live.shutdown();
    });
}

/// `nodes` node agents ready under an orchestrator this process started
/// (its handle changes the registry): the cluster, the orchestrator, its
/// events and the first epoch told.
async fn ready_in_process(
    nodes: u32,
) -> (
    LocalCluster,
    poolgate::live::Orchestrator,
    EventStream,
    Epoch,
) {
    let mut plan = plan(nodes);
    plan.external_orchestrator = true;
    let mut cluster = LocalCluster::prepare(&plan).await.unwrap();
    let live = poolgate::live::Orchestrator::start(&cluster.config)
        .await
        .unwrap();
    let mut events = live.gate.subscribe();
    for i in 0..cluster.nodes.len() {
        cluster.spawn(i).unwrap();
    }
    let epoch = ready(&mut events).await;
    (cluster, live, events, epoch)
}

#[test]
fn a_node_whose_key_is_replaced_at_runtime_is_not_ready_on_its_old_keys_word() {
    // A key replaced at runtime (a stolen key, say): the node's frames
    // under the old key are refused from then on and its connection
    // closed, so the orchestrator no longer hears it, and it may not stay
    // ready on what it said before (design §11: a lost connection makes a
    // node not available). What the table held of the node goes with its
    // sequences only: its connection is still the one whose loss counts.
    live(async {
        let (_cluster, live, mut events, _) = ready_in_process(2).await;
        let node2 = node("node-2");
        let replaced = poolgate::live::keys::NodeKey::generate().public();
        live.register(node2.clone(), replaced).await.unwrap();
        let lost = tokio::time::timeout(
            Duration::from_secs(10),
            until(&mut events, |e| match e {
                Event::ReadinessLost { node, reason, .. } if node.as_ref() == Some(&node2) => {
                    Some(*reason)
                }
                _ => None,
            }),
        )
        .await
        .expect("node-2 stayed ready on frames its replaced key signed");
        assert_eq!(lost, Reason::Unavailable);
        live.shutdown();
    });
}

#[test]
fn a_node_unregistered_and_registered_again_at_runtime_is_ready_again() {
    // Forgotten, then registered again with its key while its process
    // runs on: everything the orchestrator held of it went with it, so its
    // next frame binds its SWIM identity afresh and the gate is told its
    // state again (SWIM says nothing new: the node never changed).
    live(async {
        let (cluster, live, mut events, first) = ready_in_process(2).await;
        let node2 = node("node-2");
        let key = cluster.config.registry[&node2];
        live.unregister(&node2).await.unwrap();
        live.register(node2.clone(), key).await.unwrap();
        let Ok(again) = tokio::time::timeout(Duration::from_secs(15), ready(&mut events)).await
        else {
            let report = live.gate.report().await.unwrap();
            let blocked: Vec<String> = report
                .candidates
                .iter()
                .map(|c| format!("{}: {}", c.node, c.blockers_in_words()))
                .collect();
            panic!("the pool never ready again after node-2 was registered again: {blocked:?}");
        };
        assert!(again > first, "{again:?} after {first:?}");
        live.shutdown();
    });
}

/// Node 0 of `cluster` alone (no orchestrator), logging at info, told to
/// stop (SIGTERM) once it said `after`: its exit code, how long it took
/// to exit after the signal, and every line it said.
async fn stopped_alone(
    cluster: &LocalCluster,
    after: &str,
) -> (Option<i32>, Duration, Vec<String>) {
    let mut node = tokio::process::Command::new(env!("CARGO_BIN_EXE_poolgate"))
        .arg("node")
        .arg("--config")
        .arg(&cluster.nodes[0].config)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(node.stderr.take().unwrap()).lines();
    let mut said = Vec::new();
    while let Some(line) = lines.next_line().await.unwrap() {
        let reached = line.contains(after);
        said.push(line);
        if reached {
            break;
        }
    }
    let pid = nix::unistd::Pid::from_raw(node.id().unwrap() as i32);
    let told = std::time::Instant::now();
    nix::sys::signal::kill(pid, Signal::SIGTERM).unwrap();
    let status = node.wait().await.unwrap();
    let took = told.elapsed();
    while let Some(line) = lines.next_line().await.unwrap() {
        said.push(line);
    }
    (status.code(), took, said)
}

/// A node agent stopped as an operator stops it (SIGTERM) leaves: it says
/// so, at info, and not "declared down; identity defunct" at WARN (foca's
/// notification that follows its own leave).
#[test]
fn a_node_agent_told_to_stop_says_it_left_not_that_it_was_declared_down() {
    let mut plan = plan(1);
    plan.external_orchestrator = true;
    live(async {
        let cluster = LocalCluster::prepare(&plan).await.unwrap();
        let (code, _, said) = stopped_alone(&cluster, "node agent started").await;
        assert_eq!(code, Some(0), "{said:#?}");
        assert!(
            !said.iter().any(|l| l.contains("declared down")),
            "{said:#?}"
        );
        assert!(
            said.iter().any(|l| l.contains("left the SWIM cluster")),
            "{said:#?}"
        );
    });
}

/// A node agent with no orchestrator connection up exits at once when
/// told to stop: no leaving frame can go out, and waiting for one held a
/// restart back (an operator's trial: the next process could not bind
/// the metrics port yet).
#[test]
fn a_node_agent_told_to_stop_while_unconnected_does_not_wait_for_a_frame() {
    let mut plan = plan(1);
    plan.external_orchestrator = true;
    live(async {
        let cluster = LocalCluster::prepare(&plan).await.unwrap();
        let (code, took, said) = stopped_alone(&cluster, "no orchestrator reachable").await;
        assert_eq!(code, Some(0), "{said:#?}");
        assert!(
            said.iter()
                .any(|l| l.contains("no leaving frame is waited for")),
            "{said:#?}"
        );
        // The wait was half a second for a frame that never went.
        assert!(
            took < Duration::from_millis(500),
            "exited {took:?} after SIGTERM"
        );
    });
}

/// Design §15: with the default SWIM profile (no timings in the
/// configuration), a node agent stalled for a second (SIGSTOP, as a paused
/// VM or a starved process) faults nothing, five times over; a node
/// frozen for good, which no one can tell from a lost host, faults the
/// run within 3 s. (Before: a 0.5 s stall faulted a run 2 times in 5.)
#[test]
fn the_default_profile_rides_through_a_one_second_stall_and_still_finds_a_frozen_node() {
    live_for(Duration::from_secs(90), async {
        let plan = common::live::plan(POOL, 3);
        assert_eq!(
            plan.base.swim.timings,
            poolgate::config::SwimTimings::STEADY,
            "no timings given: the default profile"
        );
        let (mut cluster, gate, mut events) = start(&plan).await;
        let epoch = ready(&mut events).await;
        let run = committed(&gate, "stalls", epoch, &["node-1", "node-2", "node-3"]).await;
        for stall in 0..5 {
            let i = stall % 3;
            cluster.signal(i, Signal::SIGSTOP);
            tokio::time::sleep(Duration::from_secs(1)).await;
            cluster.signal(i, Signal::SIGCONT);
            // What a stall could set off (a suspicion, a silent
            // connection) would show within two probe periods.
            tokio::time::sleep(Duration::from_secs(3)).await;
            while let Ok(event) = events.try_recv() {
                assert!(
                    !matches!(
                        event,
                        Event::RunFaulted { .. } | Event::ReadinessLost { .. }
                    ),
                    "stall {stall} of node-{}: {event:?}",
                    i + 1
                );
            }
        }
        assert_eq!(gate.report().await.unwrap().run, Some(run));
        cluster.signal(1, Signal::SIGSTOP);
        let frozen = std::time::Instant::now();
        let faulted = until(&mut events, |e| match e {
            Event::RunFaulted { node, .. } => Some(node.clone()),
            _ => None,
        })
        .await;
        let after = frozen.elapsed();
        cluster.signal(1, Signal::SIGCONT);
        assert_eq!(faulted, node("node-2"));
        assert!(after < Duration::from_secs(3), "found after {after:?}");
        cluster.kill(0);
    });
}

/// An operator's trial: a node stopped for 4 s was suspected meanwhile
/// by another member whose word reached neither the node nor the
/// orchestrator; that member's verdict (foca's `Down`, at the incarnation
/// it suspected) landed after the pool was ready again and a run was
/// committed on it: `run_faulted dead` 190 ms after the commit. A node
/// agent that lost its orchestrator now joins again at a new incarnation
/// (design §15), and such a verdict is stale. The other member here is
/// an insider's socket that says only that verdict; the probe period is
/// long, so the orchestrator suspects nobody itself.
#[test]
fn a_verdict_on_a_suspicion_from_before_a_node_came_back_faults_nothing() {
    use foca::{Codec, Header, Member, Message, State};
    use poolgate::live::keys::ClusterKey;
    use poolgate::live::swim::identity::SwimIdentity;
    use poolgate::live::wire::Keyring;
    let slow = format!(
        "{POOL}{}",
        r#"[swim]
probe_period = "6s"
probe_rtt = "2s"
suspicion_timeout = "10s"
"#
    );
    live_for(Duration::from_secs(60), async {
        let (cluster, gate, mut events) = start(&common::live::plan(&slow, 1)).await;
        ready(&mut events).await;
        let key = ClusterKey::load(&cluster.dir.join("cluster.key")).unwrap();
        let keyring = Keyring::new(&[key], &cluster.config.swim.label);
        let target = cluster.orchestrator().unwrap().swim_addr;
        let insider = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let own = SwimIdentity::new("insider", insider.local_addr().unwrap(), 1);
        let send = |dst: SwimIdentity, message, updates: &[Member<SwimIdentity>]| {
            let header = Header {
                src: own.clone(),
                src_incarnation: 0,
                dst,
                message,
            };
            let mut plain = Vec::new();
            foca::PostcardCodec
                .encode_header(&header, &mut plain)
                .unwrap();
            if !updates.is_empty() {
                plain.extend_from_slice(&u16::try_from(updates.len()).unwrap().to_be_bytes());
                for update in updates {
                    foca::PostcardCodec
                        .encode_member(update, &mut plain)
                        .unwrap();
                }
            }
            keyring.seal(&plain)
        };
        // The insider joins, and learns from the feed it gets who the
        // orchestrator is and node-1 as it was before the stop.
        let announce = send(SwimIdentity::seed(target), Message::Announce, &[]);
        insider.send_to(&announce, target).await.unwrap();
        let mut buffer = vec![0u8; 65_536];
        let (orchestrator, before) = loop {
            let (len, _) = insider.recv_from(&mut buffer).await.unwrap();
            let Some(plain) = keyring.open(&buffer[..len]) else {
                continue;
            };
            let mut data = &plain[..];
            let header: Header<SwimIdentity> =
                foca::PostcardCodec.decode_header(&mut data).unwrap();
            if header.message != Message::Feed || data.len() < 2 {
                continue;
            }
            let count = u16::from_be_bytes([data[0], data[1]]);
            data = &data[2..];
            let members: Vec<Member<SwimIdentity>> = (0..count)
                .map(|_| foca::PostcardCodec.decode_member(&mut data).unwrap())
                .collect();
            let node1 = members.into_iter().find(|m| m.id().node == "node-1");
            break (header.src, node1.expect("node-1 in the feed"));
        };
        assert_eq!(before.state(), State::Alive);
        // The stop: longer than the agent's four heartbeats, shorter than
        // a probe period.
        cluster.signal(0, Signal::SIGSTOP);
        until(&mut events, |e| {
            matches!(e, Event::ReadinessLost { .. }).then_some(())
        })
        .await;
        cluster.signal(0, Signal::SIGCONT);
        let epoch = ready(&mut events).await;
        let run = committed(&gate, "after-the-stop", epoch, &["node-1"]).await;
        // The verdict on the suspicion from before the stop ended.
        let verdict = Member::new(before.id().clone(), before.incarnation(), State::Down);
        let ping = send(orchestrator, Message::Ping(1), &[verdict]);
        insider.send_to(&ping, target).await.unwrap();
        let faulted = tokio::time::timeout(
            Duration::from_secs(3),
            until(&mut events, |e| match e {
                Event::RunFaulted { reason, .. } => Some(*reason),
                _ => None,
            }),
        )
        .await;
        assert!(faulted.is_err(), "faulted: {faulted:?}");
        assert_eq!(gate.report().await.unwrap().run, Some(run));
    });
}

/// Issue 32: the registry and the pool change without a restart
/// (`Orchestrator::reload`, what SIGHUP does): a node forgotten and
/// dropped from the pool while a run over another node is committed (the
/// run unaffected; the pool's definition waits, as design §2 has it, and
/// says so), the pool redefined once the run ended, and a node's key
/// replaced (its frames under the old key refused from then on).
#[test]
fn a_reload_applies_the_registry_now_and_the_pool_once_no_run_is_committed() {
    live(async {
        let (cluster, gate, mut events) = start(&plan(3)).await;
        let live = cluster.orchestrator().unwrap();
        let epoch = ready(&mut events).await;
        let run = committed(&gate, "kept", epoch, &["node-1"]).await;
        let mut edited = cluster.config.clone();
        edited.registry.remove(&node("node-3"));
        edited.pool = poolgate::core::PoolDefinition::new(
            edited.pool.id().clone(),
            vec![node("node-1"), node("node-2")],
        )
        .unwrap();
        let said = live.reload(&edited).await.unwrap();
        assert!(
            said.iter()
                .any(|l| l == "node-3: forgotten (removed from [registry])"),
            "{said:?}"
        );
        assert!(
            said.iter().any(|l| l.contains("removed [node-3]")
                && l.contains("NOT applied while run kept is committed")),
            "{said:?}"
        );
        // node-3 forgotten: readiness lost, the run over node-1 kept.
        let lost = until(&mut events, |e| match e {
            Event::ReadinessLost { node, .. } => Some(node.clone()),
            Event::RunFaulted { .. } => panic!("the run faulted: {e:?}"),
            _ => None,
        })
        .await;
        assert_eq!(lost, Some(node("node-3")));
        assert_eq!(gate.report().await.unwrap().run, Some(run.clone()));
        gate.finish_run(run).await.unwrap();
        let said = live.reload(&edited).await.unwrap();
        assert_eq!(
            said,
            vec!["pool live members: added [], removed [node-3]".to_string()]
        );
        let members = until(&mut events, |e| match e {
            Event::PoolReady { members, .. } => Some(members.clone()),
            _ => None,
        })
        .await;
        assert_eq!(
            members.iter().map(|n| n.to_string()).collect::<Vec<_>>(),
            ["node-1", "node-2"]
        );
        // node-2's key replaced: its next frame (a heartbeat) is refused.
        let other = poolgate::live::keys::NodeKey::generate().public();
        edited.registry.insert(node("node-2"), other);
        let said = live.reload(&edited).await.unwrap();
        assert_eq!(said, vec!["node-2: key replaced".to_string()]);
        let lost = until(&mut events, |e| match e {
            Event::ReadinessLost { node, .. } => Some(node.clone()),
            _ => None,
        })
        .await;
        assert_eq!(lost, Some(node("node-2")));
        // Nothing changed: nothing said.
        assert!(live.reload(&edited).await.unwrap().is_empty());
    });
}

/// The same through the command line: `watch` reads its configuration
/// again on SIGHUP (`systemctl reload`): node-2 dropped from the pool
/// and the registry, the pool is ready again over node-1 alone, with no
/// restart.
#[test]
fn a_sighup_of_watch_applies_an_edited_pool_and_registry() {
    let mut plan = plan(2);
    plan.external_orchestrator = true;
    live(async {
        let mut cluster = LocalCluster::prepare(&plan).await.unwrap();
        let mut watch = tokio::process::Command::new(env!("CARGO_BIN_EXE_poolgate"))
            .arg("watch")
            .arg("--config")
            .arg(&cluster.config_file)
            .arg("--json")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        for i in 0..cluster.nodes.len() {
            cluster.spawn(i).unwrap();
        }
        let mut lines = BufReader::new(watch.stdout.take().unwrap()).lines();
        let first = next_ready(&mut lines).await;
        assert_eq!(
            first["members"].as_array().map(Vec::len),
            Some(2),
            "{first}"
        );
        let text = std::fs::read_to_string(&cluster.config_file).unwrap();
        let edited: String = text
            .lines()
            .filter(|l| !(l.starts_with("\"node-2\" =") || l.starts_with("node-2 =")))
            .map(|l| {
                if l.starts_with("members = ") {
                    "members = [\"node-1\"]".to_string()
                } else {
                    l.to_string()
                }
            })
            .collect::<Vec<_>>()
            .join("\n");
        assert_ne!(
            edited.lines().count(),
            text.lines().count(),
            "the registry line"
        );
        std::fs::write(&cluster.config_file, edited).unwrap();
        let pid = nix::unistd::Pid::from_raw(watch.id().unwrap() as i32);
        nix::sys::signal::kill(pid, Signal::SIGHUP).unwrap();
        let again = next_ready(&mut lines).await;
        assert_eq!(again["members"], serde_json::json!(["node-1"]), "{again}");
        assert!(again["epoch"].as_u64() > first["epoch"].as_u64(), "{again}");
        watch.kill().await.unwrap();
    });
}

/// A lone `run` waiting for its pool reads its configuration again on
/// SIGHUP (a key rotation's `pkill -HUP poolgate`), as a `watch` does,
/// then: here node-2 leaves the pool, and the run over node-1 is
/// committed with node-2 never started.
#[test]
fn a_lone_run_waiting_for_its_pool_applies_a_reload_at_once() {
    live(async {
        let (status, said) = lone_run_reloaded("node-1", &[0]).await;
        assert_eq!(status, Some(0), "{said}");
    });
}

/// A lone `run` whose required node a reload removed from the pool: its
/// plan can never be committed. It is refused at once (exit 2), as a
/// `watch` serving the control socket and a leader among replicas refuse
/// it, instead of asking again every second and holding the pool in
/// planning until its timeout (forever, with none); and at once means
/// whether the pool is ready or not (an operator's trial: with no node
/// up, it waited out its timeout and said only what blocked the pool).
#[test]
fn a_lone_run_whose_required_node_a_reload_removed_is_refused_at_once() {
    live(async {
        for spawned in [&[0, 1][..], &[]] {
            let (status, said) = lone_run_reloaded("node-1,node-2", spawned).await;
            assert_eq!(status, Some(2), "nodes {spawned:?} up: {said}");
            assert!(
                said.contains("refused") && said.contains("node-2 is not a candidate"),
                "nodes {spawned:?} up: {said}"
            );
        }
    });
}

/// A lone `run --pool b` waiting for pool b when a reload removes that
/// pool: refused, naming it (it said only "the gate has stopped").
#[test]
fn a_lone_run_whose_pool_a_reload_removed_is_refused_naming_it() {
    let mut plan = plan(2);
    plan.external_orchestrator = true;
    live(async {
        let cluster = LocalCluster::prepare(&plan).await.unwrap();
        let text = std::fs::read_to_string(&cluster.config_file).unwrap();
        let pools = |b: bool| {
            let mut lines = Vec::new();
            let mut in_pool = false;
            for l in text.lines() {
                if l == "[pool]" {
                    in_pool = true;
                    lines.push("[pools.a]\nmembers = [\"node-1\"]".to_string());
                    if b {
                        lines.push("[pools.b]\nmembers = [\"node-2\"]".to_string());
                    }
                    continue;
                }
                if in_pool && (l.starts_with("id = ") || l.starts_with("members = ")) {
                    continue;
                }
                in_pool = false;
                lines.push(l.to_string());
            }
            lines.join("\n")
        };
        std::fs::write(&cluster.config_file, pools(true)).unwrap();
        let run = tokio::process::Command::new(env!("CARGO_BIN_EXE_poolgate"))
            .arg("run")
            .arg("--config")
            .arg(&cluster.config_file)
            .args(["--pool", "b", "--", "true"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        while tokio::net::TcpStream::connect(cluster.config.agents.listen)
            .await
            .is_err()
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        std::fs::write(&cluster.config_file, pools(false)).unwrap();
        let pid = nix::unistd::Pid::from_raw(run.id().unwrap() as i32);
        nix::sys::signal::kill(pid, Signal::SIGHUP).unwrap();
        let output = tokio::time::timeout(Duration::from_secs(20), run.wait_with_output())
            .await
            .expect("still waiting after 20 s")
            .unwrap();
        let said = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{said}");
        assert!(
            said.contains("refused: pool b is no longer gated here"),
            "{said}"
        );
    });
}

/// A lone `run --require REQUIRE -- true` on a two-node pool, given a
/// SIGHUP that drops node-2 from the pool (still registered) while it
/// waits, then the nodes `spawned` started: its exit code and what it
/// said, once it exits (within 20 s).
async fn lone_run_reloaded(require: &str, spawned: &[usize]) -> (Option<i32>, String) {
    let mut plan = plan(2);
    plan.external_orchestrator = true;
    let mut cluster = LocalCluster::prepare(&plan).await.unwrap();
    let mut run = tokio::process::Command::new(env!("CARGO_BIN_EXE_poolgate"))
        .arg("run")
        .arg("--config")
        .arg(&cluster.config_file)
        .args(["--json", "--require", require, "--", "true"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    // Up once its agent listener answers (its signals are taken first).
    while tokio::net::TcpStream::connect(cluster.config.agents.listen)
        .await
        .is_err()
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let text = std::fs::read_to_string(&cluster.config_file).unwrap();
    let edited: Vec<String> = text
        .lines()
        .map(|l| match l.starts_with("members = ") {
            true => "members = [\"node-1\"]".to_string(),
            false => l.to_string(),
        })
        .collect();
    std::fs::write(&cluster.config_file, edited.join("\n")).unwrap();
    let pid = nix::unistd::Pid::from_raw(run.id().unwrap() as i32);
    nix::sys::signal::kill(pid, Signal::SIGHUP).unwrap();
    let mut stderr = BufReader::new(run.stderr.take().unwrap()).lines();
    let mut said = String::new();
    // Applied (said) before any node starts.
    let applied = tokio::time::timeout(Duration::from_secs(5), async {
        while let Some(line) = stderr.next_line().await.unwrap() {
            said.push_str(&line);
            said.push('\n');
            if line.contains("configuration read again") {
                return;
            }
        }
    })
    .await;
    for &i in spawned {
        cluster.spawn(i).unwrap();
    }
    let exited = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(line) = stderr.next_line().await.unwrap() {
            said.push_str(&line);
            said.push('\n');
        }
        run.wait().await.unwrap()
    })
    .await;
    let Ok(status) = exited else {
        panic!(
            "still waiting after 20 s (the reload applied: {}): {said}",
            applied.is_ok()
        );
    };
    (status.code(), said)
}

/// The next `pool_ready` line of a `watch --json`.
async fn next_ready(
    lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
) -> serde_json::Value {
    while let Some(line) = lines.next_line().await.unwrap() {
        let value: serde_json::Value = serde_json::from_str(&line).unwrap();
        if value["event"] == "pool_ready" {
            return value;
        }
    }
    panic!("watch ended");
}

/// Two pools over four node processes in one orchestrator (design §14):
/// A = node-1, node-2; B = node-3, node-4.
fn two_pools(config: &poolgate::Config) -> poolgate::Config {
    let mut config = config.clone();
    let pool = |id: &str, members: &[&str]| poolgate::config::PoolConfig {
        definition: poolgate::core::PoolDefinition::new(
            poolgate::core::PoolId::new(id).unwrap(),
            members.iter().map(|m| node(m)).collect(),
        )
        .unwrap(),
        convergence_window: config.convergence_window,
        planning: config.planning,
    };
    config.pools = vec![
        pool("a", &["node-1", "node-2"]),
        pool("b", &["node-3", "node-4"]),
    ];
    config.pool = config.pools[0].definition.clone();
    config
}

/// `n` node processes (not started) with an orchestrator of their own
/// to come, and a configuration of two pools over them ([`two_pools`]).
async fn two_pools_of(n: u32) -> (LocalCluster, poolgate::Config) {
    let mut plan = plan(n);
    plan.external_orchestrator = true;
    let cluster = LocalCluster::prepare(&plan).await.unwrap();
    let config = two_pools(&cluster.config);
    (cluster, config)
}

/// `config` among replicas on the etcd at `endpoint` (a 2 s lease, plain
/// http) instead of a state file.
fn on_etcd(config: &mut poolgate::Config, endpoint: &str) {
    config.state.path = None;
    config.state.etcd = vec![endpoint.to_string()];
    config.state.lease = Duration::from_secs(2);
    config.state.insecure = true;
}

/// The next `run_faulted`: its pool, run and node.
async fn next_fault(events: &mut EventStream) -> (String, String, String) {
    until(events, |e| match e {
        Event::RunFaulted {
            pool, run, node, ..
        } => Some((pool.to_string(), run.to_string(), node.to_string())),
        _ => None,
    })
    .await
}

#[test]
fn two_pools_in_one_orchestrator_fault_only_the_run_that_requires_the_lost_node() {
    live(async {
        let (mut cluster, config) = two_pools_of(4).await;
        let live = poolgate::live::Orchestrator::start(&config).await.unwrap();
        let mut events = live.fleet.subscribe();
        for i in 0..4 {
            cluster.spawn(i).unwrap();
        }
        let mut ready_pools = std::collections::BTreeMap::new();
        while ready_pools.len() < 2 {
            let (pool, epoch) = until(&mut events, |e| match e {
                Event::PoolReady { pool, epoch, .. } => Some((pool.to_string(), *epoch)),
                _ => None,
            })
            .await;
            ready_pools.insert(pool, epoch);
        }
        for (pool, required) in [("a", ["node-1", "node-2"]), ("b", ["node-3", "node-4"])] {
            let gate = live
                .fleet
                .pool(&poolgate::core::PoolId::new(pool).unwrap())
                .unwrap();
            let epoch = gate.wait_ready().await.unwrap().epoch;
            committed(&gate, &format!("run-{pool}"), epoch, &required).await;
        }
        // node-3 crashes: B's run faults, A's does not.
        cluster.kill(2);
        let faulted = next_fault(&mut events).await;
        assert_eq!(faulted, ("b".into(), "run-b".into(), "node-3".into()));
        // A's run is still guarded: node-1's crash faults it.
        cluster.kill(0);
        let faulted = next_fault(&mut events).await;
        assert_eq!(faulted, ("a".into(), "run-a".into(), "node-1".into()));
        live.shutdown();
    });
}

#[test]
fn watch_gates_every_pool_and_status_reports_each_or_one() {
    live(async {
        let (mut cluster, config) = two_pools_of(3).await;
        let file = overlapping_pools(&cluster, &config);
        let mut watch = tokio::process::Command::new(env!("CARGO_BIN_EXE_poolgate"))
            .args(["watch", "--json", "--until-ready", "--config"])
            .arg(&file)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        for i in 0..3 {
            cluster.spawn(i).unwrap();
        }
        // `--until-ready` exits once every pool was ready.
        let mut lines = BufReader::new(watch.stdout.take().unwrap()).lines();
        let mut ready = std::collections::BTreeSet::new();
        while let Some(line) = lines.next_line().await.unwrap() {
            let event: serde_json::Value = serde_json::from_str(&line).unwrap();
            assert!(
                event["pool"].is_string(),
                "every event names its pool: {line}"
            );
            if event["event"] == "pool_ready" {
                ready.insert(event["pool"].as_str().unwrap().to_string());
            }
        }
        assert_eq!(ready.into_iter().collect::<Vec<_>>(), ["a", "b"]);
        let status = watch.wait().await.unwrap();
        assert!(status.success(), "{status:?}");
        // A second watch to ask: status of every pool, then of one.
        let _watch = watch_of(&file, Stdio::null());
        let ask = |pool: Option<&str>| {
            let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_poolgate"));
            command.args(["status", "--json", "--config"]).arg(&file);
            if let Some(pool) = pool {
                command.args(["--pool", pool]);
            }
            command.output().unwrap()
        };
        let all = loop {
            let out = ask(None);
            if out.status.success() {
                break serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap();
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let pools: Vec<&str> = all["pools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["pool"].as_str().unwrap())
            .collect();
        assert_eq!(pools, ["a", "b"], "{all}");
        let b = ask(Some("b"));
        assert!(b.status.success());
        let b: serde_json::Value = serde_json::from_slice(&b.stdout).unwrap();
        assert_eq!(b["pool"], "b");
        let members: Vec<&str> = b["candidates"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["node"].as_str().unwrap())
            .collect();
        assert_eq!(members, ["node-2", "node-3"]);
        let unknown = ask(Some("z"));
        assert_eq!(unknown.status.code(), Some(1));
        // Named with the pools there are (an operator's trial: it said
        // only "no pool z").
        assert!(
            String::from_utf8_lossy(&unknown.stderr).contains("no pool z (defined: a, b)"),
            "{}",
            String::from_utf8_lossy(&unknown.stderr)
        );
    });
}

/// Sends SIGTERM to `child`.
fn sigterm(child: &tokio::process::Child) {
    let pid = nix::unistd::Pid::from_raw(child.id().expect("running") as i32);
    nix::sys::signal::kill(pid, Signal::SIGTERM).unwrap();
}

/// `child`'s exit, within 10 s.
async fn exited(child: &mut tokio::process::Child) -> std::process::ExitStatus {
    tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .expect("exited within 10 s")
        .unwrap()
}

/// `poolgate run --pool ID` of `config` (a file), its command writing its
/// pid to `<dir>/<pool>.pid` and sleeping.
fn run_on_pool(file: &std::path::Path, dir: &std::path::Path, pool: &str) -> tokio::process::Child {
    let pid_file = dir.join(format!("{pool}.pid"));
    tokio::process::Command::new(env!("CARGO_BIN_EXE_poolgate"))
        .args(["run", "--json", "--pool", pool, "--config"])
        .arg(file)
        .args(["--", "sh", "-c"])
        .arg(format!("echo $$ > '{}'; exec sleep 60", pid_file.display()))
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

/// The two pools' runs of `run_on_pool` (A's and B's), with their output:
/// node-3 crashes, so B's run faults (exit 3) and A's goes on; then a
/// SIGTERM ends A's (its run finished, exit 143).
async fn b_faults_a_ends(
    cluster: &mut LocalCluster,
    [run_a, run_b]: [&mut tokio::process::Child; 2],
    [lines_a, lines_b]: [&mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>; 2],
) {
    while !cluster.dir.join("b.pid").exists() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cluster.kill(2);
    let faulted = until_line(lines_b, |v| v["event"] == "run_faulted").await;
    assert_eq!(faulted["node"], "node-3");
    let code = exited(run_b).await;
    assert_eq!(code.code(), Some(3));
    assert!(run_a.try_wait().unwrap().is_none(), "A's run goes on");
    // A SIGTERM ends A's run: its command stops, its run is finished.
    sigterm(run_a);
    let finished = until_line(lines_a, |v| v["event"] == "run_finished").await;
    assert_eq!(finished["pool"], "a");
    let code = exited(run_a).await;
    assert_eq!(code.code(), Some(128 + 15));
}

/// Two pools over four node processes (not started) and a `watch` of
/// them, a process of its own, serving `[control] socket`: the cluster,
/// the config, its file, the socket (there once it returns) and the watch.
async fn watch_serving_a_socket() -> (
    LocalCluster,
    poolgate::Config,
    std::path::PathBuf,
    std::path::PathBuf,
    tokio::process::Child,
) {
    let (cluster, mut config) = two_pools_of(4).await;
    let socket = cluster.dir.join("control.sock");
    config.control = Some(socket.clone());
    let file = cluster.dir.join("pools.toml");
    std::fs::write(&file, poolgate::cli::cluster::orchestrator_toml(&config)).unwrap();
    let watch = watch_of(&file, Stdio::null());
    while !socket.exists() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (cluster, config, file, socket, watch)
}

#[test]
fn two_runs_on_two_pools_share_one_watch_through_its_control_socket() {
    live(async {
        use std::os::unix::fs::PermissionsExt;
        let (mut cluster, config, file, socket, mut watch) = watch_serving_a_socket().await;
        let mode = std::fs::metadata(&socket).unwrap().permissions().mode();
        assert_eq!(
            mode & 0o777,
            0o600,
            "the control socket is its owner's only"
        );
        for i in 0..4 {
            cluster.spawn(i).unwrap();
        }
        // Two runs at once, one per pool, through the one orchestrator
        // (neither binds the cluster's sockets: they are the watch's).
        let mut run_a = run_on_pool(&file, &cluster.dir, "a");
        let mut run_b = run_on_pool(&file, &cluster.dir, "b");
        let mut lines_a = BufReader::new(run_a.stdout.take().unwrap()).lines();
        let mut lines_b = BufReader::new(run_b.stdout.take().unwrap()).lines();
        let committed = until_line(&mut lines_a, |v| v["event"] == "run_committed").await;
        assert_eq!(committed["pool"], "a");
        assert_eq!(
            committed["required"],
            serde_json::json!(["node-1", "node-2"])
        );
        let committed = until_line(&mut lines_b, |v| v["event"] == "run_committed").await;
        assert_eq!(committed["pool"], "b");
        // `status` through the socket, for one pool (its config's agent
        // listener is a port nobody serves: the answer is the socket's).
        let mut elsewhere = config.clone();
        elsewhere.agents.listen = free_port();
        let status_file = cluster.dir.join("status.toml");
        std::fs::write(
            &status_file,
            poolgate::cli::cluster::orchestrator_toml(&elsewhere),
        )
        .unwrap();
        let status = std::process::Command::new(env!("CARGO_BIN_EXE_poolgate"))
            .args(["status", "--json", "--pool", "b", "--config"])
            .arg(&status_file)
            .output()
            .unwrap();
        assert!(
            status.status.success(),
            "{}",
            String::from_utf8_lossy(&status.stderr)
        );
        let answer: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
        assert_eq!(
            (answer["pool"].as_str(), answer["run"].as_str().is_some()),
            (Some("b"), true),
            "{answer}"
        );
        b_faults_a_ends(
            &mut cluster,
            [&mut run_a, &mut run_b],
            [&mut lines_a, &mut lines_b],
        )
        .await;
        // The watch removes its socket when it stops.
        sigterm(&watch);
        exited(&mut watch).await;
        assert!(!socket.exists(), "the socket is removed at exit");
    });
}

#[test]
fn a_watch_of_several_pools_recorded_replays_every_pools_events() {
    live(async {
        let (mut cluster, config) = two_pools_of(4).await;
        let file = cluster.dir.join("pools.toml");
        std::fs::write(&file, poolgate::cli::cluster::orchestrator_toml(&config)).unwrap();
        let record = cluster.dir.join("record.jsonl");
        let mut watch = tokio::process::Command::new(env!("CARGO_BIN_EXE_poolgate"))
            .args(["watch", "--json", "--config"])
            .arg(&file)
            .arg("--record")
            .arg(&record)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(watch.stdout.take().unwrap()).lines();
        for i in 0..4 {
            cluster.spawn(i).unwrap();
        }
        let mut published = Vec::new();
        let keep = |line: &str, published: &mut Vec<String>| {
            let value: serde_json::Value = serde_json::from_str(line).unwrap();
            if value["pool"].is_string() {
                published.push(line.to_string());
            }
            value
        };
        let mut ready = std::collections::BTreeSet::new();
        while ready.len() < 2 {
            let line = lines.next_line().await.unwrap().unwrap();
            let value = keep(&line, &mut published);
            if value["event"] == "pool_ready" {
                ready.insert(value["pool"].as_str().unwrap().to_string());
            }
        }
        // node-3 dies: pool b loses readiness, pool a does not.
        cluster.kill(2);
        loop {
            let line = lines.next_line().await.unwrap().unwrap();
            let value = keep(&line, &mut published);
            if value["event"] == "readiness_lost" {
                assert_eq!(value["pool"], "b", "{line}");
                break;
            }
        }
        sigterm(&watch);
        while let Some(line) = lines.next_line().await.unwrap() {
            keep(&line, &mut published);
        }
        exited(&mut watch).await;
        // One file for both pools, each named; its replay prints what the
        // watch published, pool for pool.
        let text = std::fs::read_to_string(&record).unwrap();
        let first: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
        assert_eq!(
            (first["type"].as_str(), first["pool"].as_str()),
            (Some("settings"), Some("a"))
        );
        assert!(text.contains(r#""type":"settings","pool":"b""#), "{text}");
        assert_eq!(
            published,
            common::replayed(&record, None),
            "recording:\n{text}"
        );
    });
}

#[test]
fn a_socket_left_by_a_killed_watch_is_not_served_and_run_gates_the_pool_it_names() {
    live(async {
        let (mut cluster, _, file, socket, mut watch) = watch_serving_a_socket().await;
        watch.kill().await.unwrap();
        assert!(socket.exists(), "SIGKILL leaves the socket file");
        for i in 0..4 {
            cluster.spawn(i).unwrap();
        }
        // Nobody serves it: `run --pool b` gates pool b itself.
        let mut run = run_on_pool(&file, &cluster.dir, "b");
        let mut lines = BufReader::new(run.stdout.take().unwrap()).lines();
        let committed = until_line(&mut lines, |v| v["event"] == "run_committed").await;
        assert_eq!(committed["pool"], "b");
        assert_eq!(
            committed["required"],
            serde_json::json!(["node-3", "node-4"])
        );
        run.kill().await.unwrap();
        // An unknown pool is an error, not the first pool.
        let unknown = std::process::Command::new(env!("CARGO_BIN_EXE_poolgate"))
            .args(["run", "--pool", "zz", "--config"])
            .arg(&file)
            .args(["--", "true"])
            .output()
            .unwrap();
        assert_eq!(unknown.status.code(), Some(2));
        assert!(
            String::from_utf8_lossy(&unknown.stderr).contains("no pool zz"),
            "{}",
            String::from_utf8_lossy(&unknown.stderr)
        );
    });
}

#[test]
fn a_run_whose_control_socket_orchestrator_falls_silent_stops_its_command_and_exits_5() {
    live(async {
        use tokio::io::AsyncWriteExt;
        let dir = std::env::temp_dir().join(format!("poolgate-silent-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let socket = dir.join("control.sock");
        let file = dir.join("config.toml");
        std::fs::write(
            &file,
            "[pool]\nid = \"p\"\nmembers = [\"n1\"]\n[readiness]\nconvergence_window = \"1s\"\n\
             [run]\nunguarded_after = \"2s\"\n[control]\nsocket = \"control.sock\"\n",
        )
        .unwrap();
        // An orchestrator that commits the run and then says nothing (a
        // watch frozen by SIGSTOP, or hung).
        let listener = tokio::net::UnixListener::bind(&socket).unwrap();
        let frozen = actix::spawn(async move {
            let mut held = Vec::new();
            loop {
                // `run` first knocks to see whether the socket is served.
                let (stream, _) = listener.accept().await.unwrap();
                let (reader, mut writer) = stream.into_split();
                let mut lines = BufReader::new(reader).lines();
                let Ok(Some(request)) = lines.next_line().await else {
                    continue;
                };
                assert!(request.contains("\"op\":\"run\""), "{request}");
                writer
                    .write_all(b"{\"reply\":\"committed\",\"run\":\"r1\",\"epoch\":1}\n")
                    .await
                    .unwrap();
                held.push((lines, writer));
            }
        });
        let pid_file = dir.join("command.pid");
        let began = std::time::Instant::now();
        let run = tokio::process::Command::new(env!("CARGO_BIN_EXE_poolgate"))
            .args(["run", "--config"])
            .arg(&file)
            .args(["--", "sh", "-c"])
            .arg(format!("echo $$ > '{}'; exec sleep 60", pid_file.display()))
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let out = tokio::time::timeout(Duration::from_secs(15), run.wait_with_output())
            .await
            .expect("run ends by itself")
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(5),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            began.elapsed() < Duration::from_secs(10),
            "{:?}",
            began.elapsed()
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("said nothing"), "{stderr}");
        let pid: i32 = std::fs::read_to_string(&pid_file)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let alive = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok();
        assert!(!alive, "the command is stopped");
        frozen.abort();
        let _ = std::fs::remove_dir_all(&dir);
    });
}

/// `Orchestrator::stop` returns once the state file is let go, so the
/// same process can start an orchestrator on it at once (an embedder's
/// restart, a test's). Before, the pool actors and a write in flight
/// could still hold it: "Database already open" (seen once in
/// `a_pool_added_by_a_reload_keeps_its_epochs_in_the_state_file`).
#[test]
fn an_orchestrator_stopped_lets_its_state_file_go_before_stop_returns() {
    live(async {
        let dir =
            std::env::temp_dir().join(format!("poolgate-stop-release-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let (one, two) = pool_a_then_a_and_c(&dir, "1ms");
        let n1 = node("n1");
        for round in 0..40 {
            let live = poolgate::live::Orchestrator::start(&one)
                .await
                .unwrap_or_else(|e| panic!("round {round}: {e}"));
            // A pool defined by a reload keeps its state in the file too.
            live.reload(&two).await.unwrap();
            poolgate_actors::testing::make_ready_in(&live.fleet, &n1, b"key")
                .await
                .unwrap();
            // Stopped while the epoch's write may be in flight.
            live.stop().await;
        }
        let _ = std::fs::remove_dir_all(&dir);
    });
}

#[test]
fn a_pool_added_by_a_reload_keeps_its_epochs_in_the_state_file() {
    live(async {
        let dir = std::env::temp_dir().join(format!("poolgate-reload-pool-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let (one, two) = pool_a_then_a_and_c(&dir, "20ms");
        let make_ready = |live: &poolgate::live::Orchestrator| {
            let fleet = live.fleet.clone();
            async move {
                poolgate_actors::testing::make_ready_in(&fleet, &node("n1"), b"key")
                    .await
                    .unwrap();
            }
        };
        let c = poolgate::core::PoolId::new("c").unwrap();
        let live = poolgate::live::Orchestrator::start(&one).await.unwrap();
        let said = live.reload(&two).await.unwrap();
        assert!(
            said.iter().any(|l| l.starts_with("pool c: defined")),
            "{said:?}"
        );
        make_ready(&live).await;
        let first = live
            .fleet
            .pool(&c)
            .unwrap()
            .wait_ready()
            .await
            .unwrap()
            .epoch;
        live.stop().await;
        // Started again with the pool in its config: its epochs go on.
        let live = poolgate::live::Orchestrator::start(&two).await.unwrap();
        make_ready(&live).await;
        let again = live
            .fleet
            .pool(&c)
            .unwrap()
            .wait_ready()
            .await
            .unwrap()
            .epoch;
        assert!(
            again > first,
            "epoch {again:?} after {first:?}: an epoch told twice"
        );
        live.stop().await;
        let _ = std::fs::remove_dir_all(&dir);
    });
}

#[test]
fn two_runs_on_two_pools_among_replicas_on_etcd() {
    // design §14 among replicas (§12): a `watch` replica leads every pool;
    // `run --pool a` and `run --pool b` ask theirs through etcd at once.
    need_etcd!();
    let server = etcd::Etcd::start("pools-cli");
    live(async {
        let (mut cluster, mut config) = two_pools_of(4).await;
        on_etcd(&mut config, &server.endpoint);
        let file = cluster.dir.join("pools.toml");
        std::fs::write(&file, poolgate::cli::cluster::orchestrator_toml(&config)).unwrap();
        let mut watch = watch_of(&file, Stdio::piped());
        let mut watched = BufReader::new(watch.stdout.take().unwrap()).lines();
        for i in 0..4 {
            cluster.spawn(i).unwrap();
        }
        // Both pools ready under the leading watch.
        let mut ready = std::collections::BTreeSet::new();
        while ready.len() < 2 {
            let line = until_line(&mut watched, |v| v["event"] == "pool_ready").await;
            ready.insert(line["pool"].as_str().unwrap().to_string());
        }
        let mut run_a = run_on_pool(&file, &cluster.dir, "a");
        let mut run_b = run_on_pool(&file, &cluster.dir, "b");
        let mut lines_a = BufReader::new(run_a.stdout.take().unwrap()).lines();
        let mut lines_b = BufReader::new(run_b.stdout.take().unwrap()).lines();
        let committed_a = until_line(&mut lines_a, |v| v["event"] == "run_committed").await;
        assert_eq!(committed_a["pool"], "a");
        assert_eq!(
            committed_a["required"],
            serde_json::json!(["node-1", "node-2"])
        );
        let committed_b = until_line(&mut lines_b, |v| v["event"] == "run_committed").await;
        assert_eq!(committed_b["pool"], "b");
        // Each pool's request and outcome under its own keys.
        let label = &config.swim.label;
        for (pool, committed) in [("a", &committed_a), ("b", &committed_b)] {
            let key = format!(
                "/poolgate/{label}/a/pools/{pool}/runs/{}",
                committed["run"].as_str().unwrap()
            );
            assert!(
                server.client().get(key.as_bytes()).unwrap().is_some(),
                "no outcome at {key}"
            );
        }
        b_faults_a_ends(
            &mut cluster,
            [&mut run_a, &mut run_b],
            [&mut lines_a, &mut lines_b],
        )
        .await;
        sigterm(&watch);
        exited(&mut watch).await;
    });
}

/// Pools A = node-1, node-2 and B = node-2, node-3 of `config`, written
/// to `pools.toml` in the cluster's folder.
fn overlapping_pools(cluster: &LocalCluster, config: &poolgate::Config) -> std::path::PathBuf {
    let mut config = config.clone();
    config.pools[1].definition = poolgate::core::PoolDefinition::new(
        poolgate::core::PoolId::new("b").unwrap(),
        vec![node("node-2"), node("node-3")],
    )
    .unwrap();
    let file = cluster.dir.join("pools.toml");
    std::fs::write(&file, poolgate::cli::cluster::orchestrator_toml(&config)).unwrap();
    file
}

/// Issue 32 ("`run` says what blocks the pool when it gives up") with
/// design §14: with A's run committed over node-2, `run --pool b
/// --timeout 3s`, which needs node-2, gives up (exit 1) saying node-2 is
/// reserved by A's run, not that its pool is ready. (An operator's
/// trial: among replicas it said the leader's state line, "ready".)
async fn a_run_blocked_by_a_reservation_says_so(
    cluster: &mut LocalCluster,
    file: &std::path::Path,
) {
    let (mut run_a, run) = run_a_committed(cluster, file).await;
    run_b_gives_up(file, &run, "3s").await;
    assert!(run_a.try_wait().unwrap().is_none(), "A's run goes on");
}

/// The nodes started, and `run --pool a` with its run committed; its id.
async fn run_a_committed(
    cluster: &mut LocalCluster,
    file: &std::path::Path,
) -> (tokio::process::Child, String) {
    run_committed_on(cluster, file, "a").await
}

/// Starts the cluster's three nodes and a `run --pool POOL` whose run is
/// committed; the `run` and its run id.
async fn run_committed_on(
    cluster: &mut LocalCluster,
    file: &std::path::Path,
    pool: &str,
) -> (tokio::process::Child, String) {
    for i in 0..3 {
        cluster.spawn(i).unwrap();
    }
    let mut run = run_on_pool(file, &cluster.dir, pool);
    let mut lines = BufReader::new(run.stdout.take().unwrap()).lines();
    let committed = until_line(&mut lines, |v| v["event"] == "run_committed").await;
    (run, committed["run"].as_str().unwrap().to_string())
}

/// SIGKILLs `run` and the command it guarded (pid file `<pool>.pid`):
/// its run stays committed, guarded by no `run`.
async fn killed_with_its_command(
    run: &mut tokio::process::Child,
    dir: &std::path::Path,
    pool: &str,
) {
    run.kill().await.unwrap();
    if let Ok(pid) = std::fs::read_to_string(dir.join(format!("{pool}.pid"))) {
        let pid = nix::unistd::Pid::from_raw(pid.trim().parse().unwrap());
        let _ = nix::sys::signal::kill(pid, Signal::SIGKILL);
    }
}

/// `run --end RUN` with no `--pool`, over a file of several pools: it
/// ends RUN, whichever pool it is of (exit 0). (An operator's trial: it
/// wanted `--pool`.)
async fn ended_without_naming_its_pool(file: &std::path::Path, run: &str) {
    // `poolgate run --end RUN --config FILE`: its exit code and stderr.
    let end = |run: String| async move {
        let ended = tokio::process::Command::new(env!("CARGO_BIN_EXE_poolgate"))
            .args(["run", "--end", &run, "--config"])
            .arg(file)
            .kill_on_drop(true)
            .output();
        let ended = tokio::time::timeout(Duration::from_secs(30), ended)
            .await
            .expect("run --end answers within 30 s")
            .unwrap();
        (
            ended.status.code(),
            String::from_utf8_lossy(&ended.stderr).into_owned(),
        )
    };
    let (code, said) = end(run.to_string()).await;
    assert_eq!(code, Some(0), "{said}");
    assert!(said.contains(&format!("run {run} ended")), "{said}");
    // A run no pool has is refused, naming the pools (exit 4).
    let (code, said) = end("no-such-run".to_string()).await;
    assert_eq!(code, Some(4), "{said}");
    assert!(
        said.contains("not the active run of any pool (a, b)"),
        "{said}"
    );
}

#[test]
fn run_end_alone_without_pool_ends_a_run_of_the_second_pool() {
    live(async {
        let (mut cluster, mut config) = two_pools_of(3).await;
        config.state.path = Some(cluster.dir.join("state.redb"));
        let file = overlapping_pools(&cluster, &config);
        let (mut run_b, run) = run_committed_on(&mut cluster, &file, "b").await;
        killed_with_its_command(&mut run_b, &cluster.dir, "b").await;
        ended_without_naming_its_pool(&file, &run).await;
    });
}

#[test]
fn run_end_beside_a_watch_serving_its_socket_without_pool_ends_a_restored_run_of_the_second_pool() {
    // An operator's trial: through the control socket, `run --end RUN`
    // with no `--pool` said "several pools are defined".
    live(async {
        let (mut cluster, mut config) = two_pools_of(3).await;
        config.state.path = Some(cluster.dir.join("state.redb"));
        let socket = cluster.dir.join("control.sock");
        config.control = Some(socket.clone());
        let file = overlapping_pools(&cluster, &config);
        let served = |socket: std::path::PathBuf| async move {
            while !poolgate::live::control::is_served(&socket) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        let mut watch = watch_of(&file, Stdio::null());
        served(socket.clone()).await;
        let (mut run_b, run) = run_committed_on(&mut cluster, &file, "b").await;
        // The watch dies, and its requester with it: the next watch
        // restores the run, guarded by no requester.
        watch.kill().await.unwrap();
        let _ = watch.wait().await;
        killed_with_its_command(&mut run_b, &cluster.dir, "b").await;
        let _watch = watch_of(&file, Stdio::null());
        served(socket.clone()).await;
        ended_without_naming_its_pool(&file, &run).await;
    });
}

#[test]
fn run_end_among_replicas_without_pool_ends_a_run_of_the_second_pool() {
    need_etcd!();
    let server = etcd::Etcd::start("pools-end");
    live(async {
        let (mut cluster, mut config) = two_pools_of(3).await;
        on_etcd(&mut config, &server.endpoint);
        let file = overlapping_pools(&cluster, &config);
        let _watch = watch_of(&file, Stdio::null());
        let (mut run_b, run) = run_committed_on(&mut cluster, &file, "b").await;
        killed_with_its_command(&mut run_b, &cluster.dir, "b").await;
        ended_without_naming_its_pool(&file, &run).await;
    });
}

/// `run --pool b --timeout TIMEOUT` gives up (exit 1) saying node-2 is
/// reserved by `run` of pool a.
async fn run_b_gives_up(file: &std::path::Path, run: &str, timeout: &str) {
    let blocked = tokio::process::Command::new(env!("CARGO_BIN_EXE_poolgate"))
        .args(["run", "--pool", "b", "--timeout", timeout, "--config"])
        .arg(file)
        .args(["--", "true"])
        .kill_on_drop(true)
        .output();
    let blocked = tokio::time::timeout(Duration::from_secs(30), blocked)
        .await
        .expect("run --timeout 3s gives up within 30 s")
        .unwrap();
    let said = String::from_utf8_lossy(&blocked.stderr);
    assert_eq!(blocked.status.code(), Some(1), "{said}");
    let last = said.lines().last().unwrap_or_default();
    assert!(
        last.contains(&format!("not committed within {timeout}"))
            && last.contains(&format!("node node-2 is reserved by run {run} of pool a")),
        "the line it gives up with: {last}\n{said}"
    );
}

#[test]
fn a_run_alone_blocked_by_a_restored_run_of_another_pool_says_which_node_is_reserved() {
    live(async {
        let (mut cluster, mut config) = two_pools_of(3).await;
        config.state.path = Some(cluster.dir.join("state.redb"));
        let file = overlapping_pools(&cluster, &config);
        let (mut run_a, run) = run_a_committed(&mut cluster, &file).await;
        // A's `run` SIGKILLed: its run stays committed in the state file,
        // restored by the next `run`, which no process guards.
        killed_with_its_command(&mut run_a, &cluster.dir, "a").await;
        run_b_gives_up(&file, &run, "8s").await;
    });
}

#[test]
fn a_run_blocked_by_another_pools_run_says_which_node_is_reserved_through_a_control_socket() {
    live(async {
        let (mut cluster, mut config) = two_pools_of(3).await;
        let socket = cluster.dir.join("control.sock");
        config.control = Some(socket.clone());
        let file = overlapping_pools(&cluster, &config);
        let _watch = watch_of(&file, Stdio::null());
        while !socket.exists() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        a_run_blocked_by_a_reservation_says_so(&mut cluster, &file).await;
    });
}

#[test]
fn a_run_blocked_by_another_pools_run_says_which_node_is_reserved_among_replicas() {
    need_etcd!();
    let server = etcd::Etcd::start("pools-reserved");
    live(async {
        let (mut cluster, mut config) = two_pools_of(3).await;
        on_etcd(&mut config, &server.endpoint);
        let file = overlapping_pools(&cluster, &config);
        let _watch = watch_of(&file, Stdio::null());
        let (mut run_a, run) = run_a_committed(&mut cluster, &file).await;
        run_b_gives_up(&file, &run, "3s").await;
        // A's run ends: B's next run commits. (An operator's trial: the
        // run that gave up was left planning, and every later run of B
        // said "run … is active" until another replica took over.)
        sigterm(&run_a);
        exited(&mut run_a).await;
        let next = tokio::process::Command::new(env!("CARGO_BIN_EXE_poolgate"))
            .args(["run", "--pool", "b", "--timeout", "20s", "--config"])
            .arg(&file)
            .args(["--", "true"])
            .kill_on_drop(true)
            .output()
            .await
            .unwrap();
        assert_eq!(
            next.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&next.stderr)
        );
        // Why it waited went with its request.
        let left: Vec<String> = server
            .client()
            .get_prefix(b"/poolgate/")
            .unwrap()
            .into_iter()
            .map(|kv| String::from_utf8_lossy(&kv.key).into_owned())
            .filter(|key| key.contains("/waiting/"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    });
}

/// A process killed and reaped when dropped (the test's own).
struct Reaped(std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Reads the next state line systemd would hear on `socket`, within 10 s.
fn told(socket: &std::os::unix::net::UnixDatagram) -> String {
    socket
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut buf = [0u8; 256];
    let n = socket.recv(&mut buf).expect("a state line within 10 s");
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

#[test]
fn watch_and_node_tell_systemd_ready_once_serving_and_stopping_at_sigterm() {
    // design §15: the unit files are `Type=notify`; systemd waits for
    // READY=1 before it counts the service started.
    live(async {
        let mut plan = plan(1);
        plan.external_orchestrator = true;
        let cluster = LocalCluster::prepare(&plan).await.unwrap();
        let socket_path = cluster.dir.join("notify.sock");
        let socket = std::os::unix::net::UnixDatagram::bind(&socket_path).unwrap();
        let watch = std::process::Command::new(env!("CARGO_BIN_EXE_poolgate"))
            .args(["watch", "--json", "--config"])
            .arg(&cluster.config_file)
            .env("NOTIFY_SOCKET", &socket_path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let watch = Reaped(watch);
        assert_eq!(told(&socket), "READY=1");
        // Serving by then: its agent listener accepts.
        assert!(std::net::TcpStream::connect(cluster.config.agents.listen).is_ok());
        let node = std::process::Command::new(env!("CARGO_BIN_EXE_poolgate"))
            .args(["node", "--config"])
            .arg(&cluster.nodes[0].config)
            .env("NOTIFY_SOCKET", &socket_path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let node = Reaped(node);
        assert_eq!(told(&socket), "READY=1");
        for process in [&node, &watch] {
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(process.0.id() as i32),
                Signal::SIGTERM,
            )
            .unwrap();
            assert_eq!(told(&socket), "STOPPING=1");
        }
    });
}

/// A node agent sends one frame on a new connection, then nothing until
/// it has read the orchestrator's challenge: frames signed without it
/// would be skipped, and past a few refused `bad signature` (the hosts
/// test saw a restarting node refused so, its state changing while the
/// challenge was on its way). Here, against a silent orchestrator, the
/// heartbeats (every 100 ms) wait too.
#[test]
fn a_node_agent_sends_nothing_more_before_it_reads_the_challenge() {
    let mut plan = plan(1);
    plan.external_orchestrator = true;
    live(async {
        let cluster = LocalCluster::prepare(&plan).await.unwrap();
        let config = &cluster.nodes[0].config;
        let text = std::fs::read_to_string(config).unwrap();
        assert!(text.contains("[node]\n"), "{text}");
        std::fs::write(
            config,
            text.replacen("[node]\n", "[node]\nheartbeat = \"100ms\"\n", 1),
        )
        .unwrap();
        // An orchestrator that takes the connection and never answers.
        let listener = tokio::net::TcpListener::bind(cluster.config.agents.listen)
            .await
            .unwrap();
        let mut node = node_of(config);
        let (mut stream, _) = tokio::time::timeout(Duration::from_secs(10), listener.accept())
            .await
            .expect("the node connects")
            .unwrap();
        // Until the node gives the silent connection up (four heartbeats)
        // and closes it.
        let mut frames = 0;
        let _ = tokio::time::timeout(Duration::from_secs(3), async {
            while let Ok(Some(_)) = poolgate::live::wire::read_frame(&mut stream).await {
                frames += 1;
            }
        })
        .await;
        let _ = node.kill().await;
        assert_eq!(frames, 1, "frames sent before the challenge was read");
    });
}

/// A node agent that gave up a silent leader (four heartbeats: a stalled
/// or frozen replica) and is told by a follower that this same replica
/// still leads goes back to it at once, not after a round of waiting: a
/// leader that was only stalled (and whose old connection the agent
/// closed) must hear from the node again within its lost-connection
/// grace, 100 ms, or it faults the node's run. An operator's trial found
/// the old agent back about 100 ms after that grace, when a 2 s stall of
/// the leader met a reset of the agents' connections.
#[test]
fn a_node_agent_told_by_a_follower_that_its_silent_leader_leads_goes_back_to_it_at_once() {
    let mut plan = plan(1);
    plan.external_orchestrator = true;
    live(async {
        let cluster = LocalCluster::prepare(&plan).await.unwrap();
        // The leader: takes connections and never answers (stalled).
        let leader = tokio::net::TcpListener::bind(cluster.config.agents.listen)
            .await
            .unwrap();
        let (config, refusing, _) = behind_a_follower(&cluster, leader.local_addr().unwrap()).await;
        let mut node = node_of(&config);
        // Each connection to the leader is held until the agent gives it
        // up; then how long the leader went without one.
        let mut gaps = Vec::new();
        let mut given_up: Option<std::time::Instant> = None;
        let watched = tokio::time::timeout(Duration::from_secs(20), async {
            while gaps.len() < 3 {
                let (mut stream, _) = leader.accept().await.unwrap();
                if let Some(at) = given_up.take() {
                    gaps.push(at.elapsed());
                }
                while let Ok(Some(_)) = poolgate::live::wire::read_frame(&mut stream).await {}
                given_up = Some(std::time::Instant::now());
            }
        })
        .await;
        let _ = node.kill().await;
        refusing.abort();
        assert!(
            watched.is_ok(),
            "the agent came back to the leader {} times in 20 s",
            gaps.len()
        );
        gaps.sort();
        eprintln!("back to the silent leader after: {gaps:?}");
        // The orchestrator's grace for a lost connection (design §11).
        let grace = Duration::from_millis(100);
        assert!(
            gaps[1] < grace,
            "back to the leader after {gaps:?} (the leader's grace is {grace:?})"
        );
    });
}

/// While a dead leader's lease still holds (up to its TTL), every
/// follower names it and nobody accepts the node: the agent's pauses
/// between rounds grow (100 ms doubling to 2 s), so a fleet of nodes does
/// not hammer the followers. An operator's trial counted about 45
/// refusals a second per node for the whole lease: each refusal set the
/// pause back to 100 ms.
#[test]
fn a_node_agent_refused_by_followers_naming_a_dead_leader_backs_off() {
    let mut plan = plan(1);
    plan.external_orchestrator = true;
    live(async {
        let cluster = LocalCluster::prepare(&plan).await.unwrap();
        // The leader is dead: nothing listens at its address.
        let (config, refusing, refused) =
            behind_a_follower(&cluster, cluster.config.agents.listen).await;
        let mut node = node_of(&config);
        tokio::time::sleep(Duration::from_secs(4)).await;
        let _ = node.kill().await;
        refusing.abort();
        let refused = refused.load(std::sync::atomic::Ordering::Relaxed);
        eprintln!("refusals in 4 s: {refused}");
        // Pauses of 0.1, 0.2, 0.4, 0.8, 1.6 and 2 s fit in 4 s: a few
        // rounds of at most four refusals each.
        assert!(refused <= 30, "{refused} refusals in 4 s");
        assert!(
            refused >= 2,
            "{refused} refusals in 4 s: the node never tried"
        );
    });
}

/// While followers name a leader that is gone (its lease not yet ended),
/// the node says so once, at warn: an operator's trial saw agents say
/// nothing for the ten seconds of a failover after "orchestrator lost",
/// and not "no orchestrator reachable" either (one answers: a follower).
#[test]
fn a_node_agent_says_when_the_leader_followers_name_does_not_answer() {
    let mut plan = plan(1);
    plan.external_orchestrator = true;
    live(async {
        let cluster = LocalCluster::prepare(&plan).await.unwrap();
        // The leader is dead: nothing listens at its address.
        let gone = cluster.config.agents.listen;
        let (config, refusing, refused) = behind_a_follower(&cluster, gone).await;
        // Several rounds: followed to the dead leader each time.
        let said = said_over_refusals(&config, &refused, 6).await;
        refusing.abort();
        let lines: Vec<&str> = said
            .lines()
            .filter(|l| l.contains("the leader the followers name does not answer"))
            .collect();
        assert_eq!(lines.len(), 1, "once per interval:\n{said}");
        assert!(
            lines[0].contains("WARN") && lines[0].contains(&gone.to_string()),
            "{said}"
        );
        assert!(!said.contains("no orchestrator reachable"), "{said}");
    });
}

/// While no replica leads (their etcd out of reach: followers name no
/// leader), the node says so once per interval, at warn: an operator's
/// trial saw 36 s of silence with etcd's quorum lost.
#[test]
fn a_node_agent_says_when_no_replica_leads() {
    let mut plan = plan(1);
    plan.external_orchestrator = true;
    live(async {
        let cluster = LocalCluster::prepare(&plan).await.unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let follower = listener.local_addr().unwrap();
        let config = listing(&cluster, &format!("\"{follower}\""));
        let (refusing, refused) = refuser(
            listener,
            serde_json::json!({
                "reply": "refused",
                "code": "not_leader",
                "detail": "not the leader; no replica leads now",
            }),
        );
        let said = said_over_refusals(&config, &refused, 4).await;
        refusing.abort();
        let lines = said
            .lines()
            .filter(|l| l.contains("no replica leads"))
            .count();
        assert_eq!(lines, 1, "once per interval:\n{said}");
        assert!(!said.contains("no orchestrator reachable"), "{said}");
    });
}

/// A follower naming a leader the node does not list (a node config
/// missing a replica) is said at warn, not looped on in silence.
#[test]
fn a_node_agent_says_when_followers_name_a_leader_it_does_not_list() {
    let mut plan = plan(1);
    plan.external_orchestrator = true;
    live(async {
        let cluster = LocalCluster::prepare(&plan).await.unwrap();
        let unlisted: std::net::SocketAddr = "127.0.0.1:9".parse().unwrap();
        let (config, refusing, _) = behind_a_follower(&cluster, unlisted).await;
        // The node lists the follower only.
        let text = std::fs::read_to_string(&config).unwrap();
        let text = text.replacen(&format!("\"{unlisted}\", "), "", 1);
        assert!(!text.contains(&unlisted.to_string()), "{text}");
        std::fs::write(&config, text).unwrap();
        let mut node = tokio::process::Command::new(env!("CARGO_BIN_EXE_poolgate"))
            .args(["node", "--config"])
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut lines = tokio::io::BufReader::new(node.stderr.take().unwrap()).lines();
        let said = tokio::time::timeout(Duration::from_secs(10), async {
            while let Ok(Some(line)) = lines.next_line().await {
                if line.contains("not in [orchestrator] agents") {
                    return line;
                }
            }
            String::new()
        })
        .await;
        let _ = node.kill().await;
        refusing.abort();
        let said = said.expect("said within 10 s");
        assert!(
            said.contains("127.0.0.1:9") && said.contains("WARN"),
            "{said}"
        );
    });
}

/// The cluster's one node, its `[orchestrator] agents` set to `leader`
/// and a follower the test serves, which refuses every frame `not_leader`
/// naming `leader` (its heartbeat 100 ms): the node's config, the
/// follower's task, and how many refusals it sent.
async fn behind_a_follower(
    cluster: &LocalCluster,
    leader: std::net::SocketAddr,
) -> (
    std::path::PathBuf,
    tokio::task::JoinHandle<()>,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
) {
    let follower = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let follower_addr = follower.local_addr().unwrap();
    let config = listing(cluster, &format!("[\"{leader}\", \"{follower_addr}\"]"));
    let text = std::fs::read_to_string(&config).unwrap();
    assert!(text.contains("[node]\n"), "{text}");
    let text = text.replacen("[node]\n", "[node]\nheartbeat = \"100ms\"\n", 1);
    std::fs::write(&config, text).unwrap();
    let (refusing, refused) = refuser(
        follower,
        serde_json::json!({
            "reply": "refused",
            "code": "not_leader",
            "detail": format!("not the leader; the leader is r1 at {leader}"),
            "leader": leader.to_string(),
        }),
    );
    (config, refusing, refused)
}

/// The cluster's first node's config, its `[orchestrator] agents` set to
/// `agents` (TOML: a string or a list).
fn listing(cluster: &LocalCluster, agents: &str) -> std::path::PathBuf {
    let config = cluster.nodes[0].config.clone();
    let text = std::fs::read_to_string(&config).unwrap();
    let listed = format!("agents = \"{}\"", cluster.config.agents.listen);
    assert!(text.contains(&listed), "{text}");
    std::fs::write(
        &config,
        text.replacen(&listed, &format!("agents = {agents}"), 1),
    )
    .unwrap();
    config
}

/// Serves `listener` as an orchestrator that answers every agent's first
/// frame with `refusal` (and closes): the task, and how many it refused.
fn refuser(
    listener: tokio::net::TcpListener,
    refusal: serde_json::Value,
) -> (
    tokio::task::JoinHandle<()>,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
) {
    let refusal = serde_json::to_vec(&refusal).unwrap();
    let refused = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = std::sync::Arc::clone(&refused);
    let refusing = tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let mut reply = u32::try_from(refusal.len()).unwrap().to_be_bytes().to_vec();
            reply.extend_from_slice(&refusal);
            let counted = std::sync::Arc::clone(&counted);
            tokio::spawn(async move {
                use tokio::io::AsyncWriteExt;
                if let Ok(Some(_)) = poolgate::live::wire::read_frame(&mut stream).await {
                    counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let _ = stream.write_all(&reply).await;
                }
            });
        }
    });
    (refusing, refused)
}

/// The cluster's one node (its config at `config`), its stderr kept,
/// until `refused` counts `rounds` refusals (15 s at most): every line it
/// said.
async fn said_over_refusals(
    config: &std::path::Path,
    refused: &std::sync::atomic::AtomicUsize,
    rounds: usize,
) -> String {
    let mut node = tokio::process::Command::new(env!("CARGO_BIN_EXE_poolgate"))
        .args(["node", "--config"])
        .arg(config)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while refused.load(std::sync::atomic::Ordering::Relaxed) < rounds {
        assert!(
            tokio::time::Instant::now() < deadline,
            "fewer than {rounds} refusals in 15 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = node.kill().await;
    let mut said = String::new();
    use tokio::io::AsyncReadExt;
    node.stderr
        .take()
        .unwrap()
        .read_to_string(&mut said)
        .await
        .unwrap();
    said
}

#[test]
fn an_agent_refused_by_one_orchestrator_does_not_say_none_is_reachable() {
    // An operator's trial: after a failover the new leader refused a node
    // (not in its [registry]), and the node's next round, over the one
    // address not tried yet (the dead leader's), ended in "no orchestrator
    // reachable: connection refused", which sends an operator to the
    // network instead of the registry. Here: a dead address and one that
    // refuses every frame as from an unknown node.
    let plan = {
        let mut plan = plan(1);
        plan.external_orchestrator = true;
        plan
    };
    live(async {
        let cluster = LocalCluster::prepare(&plan).await.unwrap();
        let dead = free_port();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let refusing = listener.local_addr().unwrap();
        let config = listing(&cluster, &format!("[\"{dead}\", \"{refusing}\"]"));
        let (serving, refused) = refuser(
            listener,
            serde_json::json!({
                "reply": "refused",
                "code": "unknown_node",
                "detail": "node node-1 is not in the orchestrator's [registry]",
            }),
        );
        // Four refusals: four rounds at least, with the rounds over the
        // dead address between them.
        let said = said_over_refusals(&config, &refused, 4).await;
        serving.abort();
        assert!(
            said.contains("not in the orchestrator's [registry]"),
            "{said}"
        );
        assert!(!said.contains("no orchestrator reachable"), "{said}");
    });
}

/// `poolgate node --config file`, its output not kept, killed when
/// dropped.
fn node_of(file: &std::path::Path) -> tokio::process::Child {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_poolgate"))
        .arg("node")
        .arg("--config")
        .arg(file)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

/// `poolgate watch --json --config file`, as the tests here start it:
/// its stderr not kept, its stdout as `stdout`, killed when dropped.
fn watch_of(file: &std::path::Path, stdout: Stdio) -> tokio::process::Child {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_poolgate"))
        .args(["watch", "--json", "--config"])
        .arg(file)
        .stdout(stdout)
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

/// Two configurations over a state file in `dir` (window `window`): pool
/// `a` of `n1`, then pools `a` and `c` of `n1` (what a reload adds).
fn pool_a_then_a_and_c(
    dir: &std::path::Path,
    window: &str,
) -> (poolgate::Config, poolgate::Config) {
    let text = |pools: &str| {
        format!(
            "[readiness]\nconvergence_window = \"{window}\"\n{pools}\
             [swim]\nbind = \"127.0.0.1:0\"\ninsecure = true\n[agents]\nlisten = \"127.0.0.1:0\"\n\
             [state]\npath = \"{}\"\n",
            dir.join("state.db").display()
        )
    };
    let one = poolgate::Config::parse(&text("[pools.a]\nmembers = [\"n1\"]\n"), "one").unwrap();
    let two = poolgate::Config::parse(
        &text("[pools.a]\nmembers = [\"n1\"]\n[pools.c]\nmembers = [\"n1\"]\n"),
        "two",
    )
    .unwrap();
    (one, two)
}

#[test]
fn a_node_no_swim_datagram_reaches_is_vouched_for_by_its_agent_connection_until_it_stalls() {
    // Design §15: a SWIM probe unanswered over UDP falls back on the
    // probed node's agent connection, which the orchestrator holds. Node-3
    // advertises a SWIM address nobody reads (a port this test holds):
    // every probe of it goes unanswered, as under total UDP loss, while
    // its agent connection is fine. Without the fallback the first probe
    // of it made it suspect and faulted the run.
    live(async {
        let blackhole = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let mut cluster = LocalCluster::prepare(&plan(3)).await.unwrap();
        let gate = cluster.orchestrator().unwrap().gate.clone();
        let mut events = gate.subscribe();
        let config = &cluster.nodes[2].config;
        let text = std::fs::read_to_string(config).unwrap().replacen(
            "bind = \"127.0.0.1:0\"\n",
            &format!(
                "bind = \"127.0.0.1:0\"\nadvertise = \"{}\"\n",
                blackhole.local_addr().unwrap()
            ),
            1,
        );
        std::fs::write(config, text).unwrap();
        for i in 0..3 {
            cluster.spawn(i).unwrap();
        }
        let epoch = ready(&mut events).await;
        committed(&gate, "r1", epoch, &["node-1", "node-2", "node-3"]).await;
        // Fifty probe periods (200 ms each): every member probes node-3
        // about seventeen times, every probe unanswered, none suspects it.
        let guarded = tokio::time::timeout(
            Duration::from_secs(10),
            until(&mut events, |e| match e {
                Event::RunFaulted { node, reason, .. } => Some((node.clone(), *reason)),
                _ => None,
            }),
        )
        .await;
        assert!(guarded.is_err(), "the run faulted: {guarded:?}");
        // Stalled, node-3 sends no frames: nobody vouches for it, and the
        // run faults.
        cluster.signal(2, Signal::SIGSTOP);
        let faulted = until(&mut events, |e| match e {
            Event::RunFaulted { node, reason, .. } => Some((node.clone(), *reason)),
            _ => None,
        })
        .await;
        cluster.signal(2, Signal::SIGCONT);
        assert_eq!(faulted.0, node("node-3"), "{faulted:?}");
        drop(blackhole);
    });
}

#[test]
fn a_node_killed_and_restarted_at_once_faults_the_run_that_requires_it() {
    // An operator's finding: a node agent killed (SIGKILL) and started
    // again at once, as a supervisor would, reconnected within the lost
    // connection's grace (design §11): the crash went unseen and the run
    // stayed committed. A frame signing another generation is another
    // process: the one the run ran on is gone.
    live(async {
        let (mut cluster, gate, mut events) = start(&plan(2)).await;
        let epoch = ready(&mut events).await;
        let run = committed(&gate, "r1", epoch, &["node-1", "node-2"]).await;
        cluster.kill(1);
        cluster.spawn(1).unwrap();
        let faulted = tokio::time::timeout(
            Duration::from_secs(10),
            until(&mut events, |e| match e {
                Event::RunFaulted {
                    run: r,
                    node,
                    reason,
                    ..
                } if *r == run => Some((node.clone(), *reason)),
                _ => None,
            }),
        )
        .await
        .expect("the run faulted");
        assert_eq!(faulted.0, node("node-2"), "{faulted:?}");
        // The restarted node is ready again: a new epoch.
        let again = ready(&mut events).await;
        assert!(again > epoch);
    });
}
