//! The command dies with its guard (issue 20): `poolgate run` guards a
//! `sh -c '…; sleep …; …'` whose `sleep` is a grandchild of `run`; after a
//! fault, a SIGTERM and a SIGKILL of `run`, no process of its group is
//! left. A signalled `run` ends its run first; a `run` that finds a
//! restored run in its way says so and exits 4; `--end` and `--resume`
//! deal with it. Real `poolgate node` processes on 127.0.0.1, each test
//! bounded.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use crate::common::live::live_for;
use crate::common::procs::{sleeping, until_sleeping};
use crate::{common, etcd};
use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;
use poolgate::cli::cluster::{ClusterPlan, LocalCluster};
use tokio::io::{AsyncBufReadExt, BufReader};

const BASE: &str = r#"
[pool]
id = "guard"
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

const LIMIT: Duration = Duration::from_secs(60);

type Lines = tokio::io::Lines<BufReader<tokio::process::ChildStdout>>;

fn plan(nodes: u32, state: Option<&Path>) -> ClusterPlan {
    let mut plan = common::live::plan(BASE, nodes);
    plan.external_orchestrator = true;
    plan.base.state.path = state.map(Path::to_path_buf);
    plan
}

async fn cluster(plan: &ClusterPlan) -> LocalCluster {
    let mut cluster = LocalCluster::prepare(plan).await.unwrap();
    for i in 0..cluster.nodes.len() {
        cluster.spawn(i).unwrap();
    }
    cluster
}

/// `poolgate run --json [extra] -- sh -c '…'`: the shell writes its pid
/// (its process group's id) and runs `sleep` as a child of its own.
fn guarded_run(cluster: &LocalCluster, extra: &[&str]) -> (tokio::process::Child, PathBuf) {
    guarded_run_of(cluster, &cluster.config_file, extra)
}

/// As [`guarded_run`], with the configuration at `config`.
fn guarded_run_of(
    cluster: &LocalCluster,
    config: &Path,
    extra: &[&str],
) -> (tokio::process::Child, PathBuf) {
    let pid_file = cluster.dir.join(format!("group-{}.pid", extra.len()));
    let _ = std::fs::remove_file(&pid_file);
    let run = tokio::process::Command::new(env!("CARGO_BIN_EXE_poolgate"))
        .arg("run")
        .arg("--config")
        .arg(config)
        .arg("--json")
        .args(extra)
        .args(["--", "sh", "-c"])
        .arg(format!(
            "echo $$ > '{}'; sleep 300; echo never",
            pid_file.display()
        ))
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(said_by(&pid_file)).unwrap())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    (run, pid_file)
}

/// Where a [`guarded_run_of`] whose command writes `pid_file` says what
/// it says (its stderr).
fn said_by(pid_file: &Path) -> PathBuf {
    pid_file.with_extension("said")
}

async fn until_line(lines: &mut Lines, event: &str) -> serde_json::Value {
    while let Some(line) = lines.next_line().await.unwrap() {
        let value: serde_json::Value = serde_json::from_str(&line).unwrap();
        if value["event"] == event {
            return value;
        }
    }
    panic!("the output ended before {event}");
}

/// The command's process group, once its shell has written it.
async fn group_of(pid_file: &Path) -> Pid {
    loop {
        match std::fs::read_to_string(pid_file) {
            Ok(text) if text.ends_with('\n') => return Pid::from_raw(text.trim().parse().unwrap()),
            _ => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

/// Whether any process of `group` is left, once the grace (5 s) and a
/// margin have passed.
async fn group_gone(group: Pid) -> bool {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(8);
    while tokio::time::Instant::now() < deadline {
        if killpg(group, None).is_err() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

fn kill_group(group: Pid) {
    let _ = killpg(group, Signal::SIGKILL);
}

async fn exit_code(run: &mut tokio::process::Child) -> Option<i32> {
    tokio::time::timeout(Duration::from_secs(15), run.wait())
        .await
        .expect("run exits")
        .unwrap()
        .code()
}

#[test]
fn a_fault_stops_the_whole_group_of_the_command() {
    live_for(LIMIT, async {
        let mut cluster = cluster(&plan(2, None)).await;
        let (mut run, pid_file) = guarded_run(&cluster, &["--require", "node-1"]);
        let mut lines = BufReader::new(run.stdout.take().unwrap()).lines();
        until_line(&mut lines, "run_committed").await;
        let group = group_of(&pid_file).await;
        assert_ne!(group.as_raw() as u32, run.id().unwrap(), "its own group");
        cluster.kill(0);
        until_line(&mut lines, "run_faulted").await;
        assert_eq!(exit_code(&mut run).await, Some(3));
        let gone = group_gone(group).await;
        kill_group(group);
        assert!(gone, "the shell's sleep outlived the fault");
    });
}

#[test]
fn a_sigterm_of_run_stops_the_group_ends_the_run_and_exits_143() {
    live_for(LIMIT, async {
        let dir = scratch("sigterm");
        let cluster = cluster(&plan(2, Some(&dir.join("state.db")))).await;
        let (mut run, pid_file) = guarded_run(&cluster, &["--require", "node-1"]);
        let mut lines = BufReader::new(run.stdout.take().unwrap()).lines();
        let committed = until_line(&mut lines, "run_committed").await;
        let group = group_of(&pid_file).await;
        kill(Pid::from_raw(run.id().unwrap() as i32), Signal::SIGTERM).unwrap();
        let finished = until_line(&mut lines, "run_finished").await;
        assert_eq!(finished["run"], committed["run"]);
        assert_eq!(exit_code(&mut run).await, Some(128 + 15));
        let gone = group_gone(group).await;
        kill_group(group);
        assert!(gone, "the shell's sleep outlived a SIGTERM of run");
        // Nothing restored stands in the next run's way.
        let (mut next, next_pid) = guarded_run(&cluster, &["--require", "node-2"]);
        let mut lines = BufReader::new(next.stdout.take().unwrap()).lines();
        until_line(&mut lines, "run_committed").await;
        let next_group = group_of(&next_pid).await;
        next.kill().await.unwrap();
        let gone = group_gone(next_group).await;
        kill_group(next_group);
        assert!(gone);
        let _ = std::fs::remove_dir_all(&dir);
    });
}

#[test]
fn a_sigkilled_run_leaves_no_command_and_its_restored_run_is_named_then_ended() {
    live_for(LIMIT, async {
        let dir = scratch("sigkill");
        let cluster = cluster(&plan(2, Some(&dir.join("state.db")))).await;
        let (mut run, pid_file) = guarded_run(&cluster, &["--require", "node-1"]);
        let mut lines = BufReader::new(run.stdout.take().unwrap()).lines();
        let committed = until_line(&mut lines, "run_committed").await;
        let name = committed["run"].as_str().unwrap().to_string();
        let group = group_of(&pid_file).await;
        run.kill().await.unwrap();
        let _ = run.wait().await;
        let gone = group_gone(group).await;
        kill_group(group);
        assert!(gone, "the command outlived a SIGKILL of run");
        // The run is still committed in the state file: a new run says so
        // at once and exits 4, naming the ways out.
        let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_poolgate"))
            .arg("run")
            .arg("--config")
            .arg(&cluster.config_file)
            .args(["--timeout", "20s", "--", "true"])
            .output();
        let output = tokio::time::timeout(Duration::from_secs(25), output)
            .await
            .expect("no spin")
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(4), "{stderr}");
        assert!(
            stderr.contains(&format!("--resume {name}"))
                && stderr.contains(&format!("--end {name}")),
            "{stderr}"
        );
        // `--resume` guards it with a new command, which ends it.
        let resumed = tokio::process::Command::new(env!("CARGO_BIN_EXE_poolgate"))
            .arg("run")
            .arg("--config")
            .arg(&cluster.config_file)
            .args(["--json", "--resume", &name, "--", "sh", "-c", "exit 7"])
            .output();
        let resumed = tokio::time::timeout(Duration::from_secs(25), resumed)
            .await
            .expect("resume ends")
            .unwrap();
        assert_eq!(
            resumed.status.code(),
            Some(7),
            "{}",
            String::from_utf8_lossy(&resumed.stderr)
        );
        // Ended: `--end` finds nothing to end, and a new run commits.
        let ended = tokio::process::Command::new(env!("CARGO_BIN_EXE_poolgate"))
            .arg("run")
            .arg("--config")
            .arg(&cluster.config_file)
            .args(["--end", &name])
            .output()
            .await
            .unwrap();
        assert_eq!(ended.status.code(), Some(4));
        let _ = std::fs::remove_dir_all(&dir);
    });
}

#[test]
fn run_end_ends_a_restored_run() {
    live_for(LIMIT, async {
        let dir = scratch("end");
        let cluster = cluster(&plan(1, Some(&dir.join("state.db")))).await;
        let (mut run, pid_file) = guarded_run(&cluster, &[]);
        let mut lines = BufReader::new(run.stdout.take().unwrap()).lines();
        let committed = until_line(&mut lines, "run_committed").await;
        let name = committed["run"].as_str().unwrap().to_string();
        let group = group_of(&pid_file).await;
        run.kill().await.unwrap();
        let _ = run.wait().await;
        let gone = group_gone(group).await;
        kill_group(group);
        assert!(gone);
        let ended = tokio::process::Command::new(env!("CARGO_BIN_EXE_poolgate"))
            .arg("run")
            .arg("--config")
            .arg(&cluster.config_file)
            .args(["--end", &name])
            .output()
            .await
            .unwrap();
        let stderr = String::from_utf8_lossy(&ended.stderr);
        assert_eq!(ended.status.code(), Some(0), "{stderr}");
        assert!(stderr.contains(&format!("run {name} ended")), "{stderr}");
        let next = tokio::process::Command::new(env!("CARGO_BIN_EXE_poolgate"))
            .arg("run")
            .arg("--config")
            .arg(&cluster.config_file)
            .args(["--timeout", "20s", "--", "true"])
            .output()
            .await
            .unwrap();
        assert_eq!(next.status.code(), Some(0));
        let _ = std::fs::remove_dir_all(&dir);
    });
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("poolgate-guard-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A health check that writes 70,000 bytes on one stderr line and fails:
/// the fault is delivered (the reason cut to 1 KiB), where the uncut
/// reason made a frame over the limit, refused again and again.
#[test]
fn a_fault_with_a_70000_byte_reason_is_delivered_cut_to_one_kib() {
    let mut plan = common::live::plan(BASE, 1);
    plan.health_check = Some(vec![
        "sh".into(),
        "-c".into(),
        "head -c 70000 /dev/zero | tr '\\0' x >&2; exit 1".into(),
    ]);
    live_for(LIMIT, async {
        let mut cluster = LocalCluster::prepare(&plan).await.unwrap();
        let gate = cluster.orchestrator().unwrap().gate.clone();
        cluster.spawn(0).unwrap();
        // The node never gets ready; its fault reaches the gate.
        let reason = loop {
            let report = gate.report().await.unwrap();
            if let Some(fault) = report.candidates[0].detail.fault.clone() {
                break fault;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert_eq!(reason.len(), poolgate::core::MAX_REASON_BYTES);
        assert!(reason.chars().all(|c| c == 'x'));
    });
}

/// A hung health check (`sh` running `sleep`) is stopped as a group each
/// time it overruns its interval: no `sleep` piles up.
#[test]
fn a_hung_health_check_leaves_no_process_behind() {
    let marker = format!("poolgate-hung-{}", std::process::id());
    let mut plan = common::live::plan(BASE, 1);
    plan.health_interval = Duration::from_millis(200);
    plan.health_check = Some(vec![
        "sh".into(),
        "-c".into(),
        format!("sleep 300 {marker}; true"),
    ]);
    live_for(LIMIT, async {
        let mut cluster = LocalCluster::prepare(&plan).await.unwrap();
        cluster.spawn(0).unwrap();
        // Ten intervals: ten checks started and stopped.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let running = sleeping(&marker);
        cluster.kill(0);
        assert!(running <= 2, "{running} sleeps of hung checks left");
    });
    // The node's last check goes with the node.
    let left = until_sleeping(&marker, 0, Duration::from_secs(8));
    assert_eq!(left, 0, "a check outlived its node");
}

/// The children of process `pid`.
fn children(pid: u32) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/stat"))
                .ok()
                .and_then(|s| {
                    let after = s.rsplit_once(')')?.1.to_string();
                    after.split_whitespace().nth(1)?.parse::<u32>().ok()
                })
                == Some(pid)
        })
        .collect()
}

/// `poolgate run … -- sh -c SCRIPT` with its stdout and group as given.
fn run_with(
    cluster: &LocalCluster,
    stdout: Stdio,
    own_group: bool,
    script: &str,
) -> tokio::process::Child {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_poolgate"));
    command
        .arg("run")
        .arg("--config")
        .arg(&cluster.config_file)
        .args(["--json", "--require", "node-1", "--", "sh", "-c", script])
        .stdout(stdout)
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    if own_group {
        command.process_group(0);
    }
    command.spawn().unwrap()
}

#[test]
fn a_stdout_nobody_reads_does_not_stop_the_guard() {
    // Adversary: with stdout a full pipe, printing run_faulted blocked the
    // orchestrator's thread; the command ran on, unguarded, for as long.
    live_for(LIMIT, async {
        let mut cluster = cluster(&plan(2, None)).await;
        let pid_file = cluster.dir.join("blocked.pid");
        let (reader, writer) = std::io::pipe().unwrap();
        let script = format!(
            "echo $$ > '{}'; head -c 300000 /dev/zero; sleep 300",
            pid_file.display()
        );
        let mut run = run_with(&cluster, Stdio::from(writer), false, &script);
        let group = group_of(&pid_file).await;
        cluster.kill(0);
        assert_eq!(exit_code(&mut run).await, Some(3));
        let gone = group_gone(group).await;
        kill_group(group);
        drop(reader);
        assert!(gone, "the command outlived its fault");
    });
}

#[test]
fn a_closed_stdout_is_no_reason_to_panic_or_stop_the_command() {
    live_for(LIMIT, async {
        let cluster = cluster(&plan(2, None)).await;
        let pid_file = cluster.dir.join("closed.pid");
        let script = format!("echo $$ > '{}'; sleep 300", pid_file.display());
        let mut run = run_with(&cluster, Stdio::piped(), false, &script);
        drop(run.stdout.take());
        let group = group_of(&pid_file).await;
        // Events still come (node-2 leaves); run keeps guarding.
        cluster.signal(1, Signal::SIGTERM);
        let alive = tokio::time::timeout(Duration::from_secs(2), run.wait()).await;
        assert!(alive.is_err(), "run ended: {alive:?}");
        assert!(killpg(group, None).is_ok(), "the command was stopped");
        kill(Pid::from_raw(run.id().unwrap() as i32), Signal::SIGTERM).unwrap();
        let output = run.wait_with_output().await.unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(143), "{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        let gone = group_gone(group).await;
        kill_group(group);
        assert!(gone);
    });
}

#[test]
fn sigkill_of_runs_whole_group_still_stops_the_command() {
    // Adversary: the keeper sat in run's group, so `kill -KILL -- -PGID`
    // (or Ctrl-\) took it with run and left the command running.
    live_for(LIMIT, async {
        let cluster = cluster(&plan(1, None)).await;
        let pid_file = cluster.dir.join("group.pid");
        let script = format!("echo $$ > '{}'; sleep 300", pid_file.display());
        let run = run_with(&cluster, Stdio::null(), true, &script);
        let group = group_of(&pid_file).await;
        let run_group = Pid::from_raw(run.id().unwrap() as i32);
        killpg(run_group, Signal::SIGKILL).unwrap();
        let gone = group_gone(group).await;
        kill_group(group);
        assert!(gone, "the command outlived its guard's group");
    });
}

#[test]
fn a_sighup_reaching_the_keeper_changes_nothing() {
    // Adversary: `pkill -HUP poolgate` (key rotation) stopped a healthy
    // command, and run reported run_finished and exit 143.
    live_for(LIMIT, async {
        let cluster = cluster(&plan(1, None)).await;
        let pid_file = cluster.dir.join("hup.pid");
        let script = format!("echo $$ > '{}'; sleep 300", pid_file.display());
        let mut run = run_with(&cluster, Stdio::null(), false, &script);
        let group = group_of(&pid_file).await;
        let keepers = children(run.id().unwrap());
        assert!(!keepers.is_empty());
        for keeper in keepers {
            let _ = kill(Pid::from_raw(keeper as i32), Signal::SIGHUP);
        }
        kill(Pid::from_raw(run.id().unwrap() as i32), Signal::SIGHUP).unwrap();
        let ended = tokio::time::timeout(Duration::from_secs(2), run.wait()).await;
        assert!(ended.is_err(), "run ended on SIGHUP: {ended:?}");
        assert!(
            killpg(group, None).is_ok(),
            "the command was stopped by SIGHUP"
        );
        run.kill().await.unwrap();
        let gone = group_gone(group).await;
        kill_group(group);
        assert!(gone);
    });
}

#[test]
fn a_restored_run_in_the_way_is_said_at_once_even_on_a_pool_that_is_not_ready() {
    live_for(LIMIT, async {
        let dir = scratch("not-ready");
        let mut cluster = cluster(&plan(1, Some(&dir.join("state.db")))).await;
        let (mut run, pid_file) = guarded_run(&cluster, &[]);
        let mut lines = BufReader::new(run.stdout.take().unwrap()).lines();
        until_line(&mut lines, "run_committed").await;
        let group = group_of(&pid_file).await;
        run.kill().await.unwrap();
        let _ = run.wait().await;
        let gone = group_gone(group).await;
        kill_group(group);
        assert!(gone);
        cluster.kill(0);
        let started = std::time::Instant::now();
        let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_poolgate"))
            .arg("run")
            .arg("--config")
            .arg(&cluster.config_file)
            .args(["--timeout", "30s", "--", "true"])
            .output()
            .await
            .unwrap();
        assert_eq!(output.status.code(), Some(4));
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{:?}",
            started.elapsed()
        );
        let _ = std::fs::remove_dir_all(&dir);
    });
}

#[test]
fn a_process_that_left_the_group_with_setsid_is_stopped_too() {
    // Adversary: `setsid sleep …` escaped the group kill of a SIGTERMed run.
    let marker = format!("9{}", std::process::id());
    live_for(LIMIT, async {
        let cluster = cluster(&plan(1, None)).await;
        let pid_file = cluster.dir.join("setsid.pid");
        let script = format!(
            "echo $$ > '{}'; setsid sleep 301{marker} & sleep 302{marker}",
            pid_file.display()
        );
        let mut run = run_with(&cluster, Stdio::null(), false, &script);
        let group = group_of(&pid_file).await;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while sleeping(&marker) < 2 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(sleeping(&marker), 2);
        kill(Pid::from_raw(run.id().unwrap() as i32), Signal::SIGTERM).unwrap();
        assert_eq!(exit_code(&mut run).await, Some(143));
        kill_group(group);
        let left = sleeping(&marker);
        assert_eq!(left, 0, "a sleep outlived the run");
    });
}

/// Replicas on etcd: a leader in this process over `nodes` node
/// processes, and a configuration for a `poolgate run` among them that
/// reaches etcd through `proxy` (`unguarded_after` as given).
async fn among_replicas(
    server: &etcd::Etcd,
    proxy: &etcd::Proxy,
    nodes: u32,
    unguarded_after: Duration,
) -> (
    LocalCluster,
    poolgate::ha::replica::Replica,
    poolgate::live::Orchestrator,
    PathBuf,
) {
    let mut plan = plan(nodes, None);
    plan.base.state.etcd = vec![server.endpoint.clone()];
    plan.base.state.lease = Duration::from_secs(2);
    plan.base.state.insecure = true;
    plan.base.run.unguarded_after = unguarded_after;
    let cluster = cluster(&plan).await;
    let mut replica = poolgate::ha::replica::Replica::start(&cluster.config).unwrap();
    let live = replica.lead(None).await.unwrap();
    let text = std::fs::read_to_string(&cluster.config_file).unwrap();
    let requester = cluster.dir.join("requester.toml");
    std::fs::write(
        &requester,
        text.replace(&server.endpoint, &proxy.endpoint()),
    )
    .unwrap();
    (cluster, replica, live, requester)
}

/// Waits (up to 10 s) for the pool to be forming (a node it needs gone).
async fn until_forming(gate: &poolgate::Gate) {
    tokio::time::timeout(Duration::from_secs(10), async {
        while !matches!(
            gate.report().await.unwrap().phase,
            poolgate::core::PoolPhase::Forming
        ) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("not ready without node-1");
}

/// Waits (up to 20 s) for the leader to end a run whose requester is
/// gone for good (`run_finished`).
async fn until_ended_by_the_leader(events: &mut poolgate::EventStream) {
    tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            match events.recv().await {
                Some(poolgate::core::Event::RunFinished { .. }) => return,
                Some(_) => continue,
                None => panic!("the gate stopped"),
            }
        }
    })
    .await
    .expect("the leader ends the run of a requester gone for good");
}

/// Issue 28, reproduction 2: a `run` among replicas that cannot confirm
/// its run is guarded (etcd out of its reach) went on forever. It must
/// stop its command and exit 5 once `[run] unguarded_after` has passed;
/// its session then expires and the leader ends the run, with a reason.
#[test]
fn a_run_that_cannot_confirm_its_run_guarded_stops_its_command_and_exits_5() {
    need_etcd!();
    let server = etcd::Etcd::start("unguarded");
    let proxy = etcd::Proxy::start(server.port());
    live_for(LIMIT, async {
        let (cluster, replica, live, requester) =
            among_replicas(&server, &proxy, 2, Duration::from_secs(2)).await;
        let (mut run, pid_file) = guarded_run_of(&cluster, &requester, &["--require", "node-1"]);
        let mut lines = BufReader::new(run.stdout.take().unwrap()).lines();
        let committed = until_line(&mut lines, "run_committed").await;
        let group = group_of(&pid_file).await;
        proxy.set_cut(true);
        assert_eq!(
            exit_code(&mut run).await,
            Some(5),
            "fails closed with exit 5"
        );
        let gone = group_gone(group).await;
        kill_group(group);
        assert!(gone, "the command outlived its unguarded run");
        // The requester is gone for good: the leader ends its run, and
        // writes why.
        let id = poolgate::core::RunId::new(committed["run"].as_str().unwrap()).unwrap();
        tokio::time::timeout(Duration::from_secs(10), async {
            while live.gate.report().await.unwrap().run.as_ref() == Some(&id) {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await
        .expect("the leader ends the run of a requester gone for good");
        let key = format!("/poolgate/{}/guard/runs/{id}", cluster.config.swim.label);
        let outcome = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                if let Ok(Some(kv)) = server.client().get(key.as_bytes()) {
                    let outcome: serde_json::Value = serde_json::from_slice(&kv.value).unwrap();
                    if outcome["status"] != "committed" {
                        return outcome;
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await
        .expect("the run's end is written");
        assert_eq!(outcome["status"], "ended", "{outcome}");
        assert!(
            outcome["reason"]
                .as_str()
                .is_some_and(|r| r.contains("requester is gone")),
            "{outcome}"
        );
        live.stop().await;
        replica.resign();
    });
}

/// How a requester goes away from its run.
#[derive(Clone, Copy)]
enum Away {
    /// `run` frozen (SIGSTOP).
    Frozen,
    /// `run` cut off from etcd.
    Cut,
}

/// A `run` among replicas (`unguarded_after` as given) whose run is
/// committed goes `away` until the leader ends its run (its session
/// expired): whether its command was still there at that moment, and
/// `run`'s exit code once it is back.
async fn away_until_ended(
    name: &str,
    away: Away,
    unguarded_after: Duration,
) -> (bool, Option<i32>, String) {
    let server = etcd::Etcd::start(name);
    let proxy = etcd::Proxy::start(server.port());
    let (cluster, replica, live, requester) =
        among_replicas(&server, &proxy, 2, unguarded_after).await;
    let mut events = live.gate.subscribe();
    let (mut run, pid_file) = guarded_run_of(&cluster, &requester, &["--require", "node-1"]);
    let mut lines = BufReader::new(run.stdout.take().unwrap()).lines();
    until_line(&mut lines, "run_committed").await;
    let group = group_of(&pid_file).await;
    let pid = Pid::from_raw(run.id().unwrap() as i32);
    match away {
        Away::Frozen => kill(pid, Signal::SIGSTOP).unwrap(),
        Away::Cut => proxy.set_cut(true),
    }
    until_ended_by_the_leader(&mut events).await;
    let alive_at_the_end = killpg(group, None).is_ok();
    if let Away::Frozen = away {
        kill(pid, Signal::SIGCONT).unwrap();
    }
    let code = exit_code(&mut run).await;
    let said = std::fs::read_to_string(said_by(&pid_file)).unwrap_or_default();
    kill_group(group);
    live.stop().await;
    replica.resign();
    (alive_at_the_end, code, said)
}

/// An operator's finding: a `run` frozen (SIGSTOP) past its session had
/// its run ended by the leader (its requester gone) while its command ran
/// on until `run` was continued: nothing guarded it, and nothing could
/// stop it. The keeper hears from `run` several times a second; with no
/// sign for half of `[run] unguarded_after` it stops the command, before
/// the session can expire and the leader end the run. `run`, continued,
/// says so and exits 5.
#[test]
fn a_frozen_run_has_its_command_stopped_before_the_leader_ends_its_run() {
    need_etcd!();
    live_for(LIMIT, async {
        let (alive, code, said) =
            away_until_ended("frozen-run", Away::Frozen, Duration::from_secs(2)).await;
        assert!(
            !alive,
            "the command still ran when the leader ended its run"
        );
        assert_eq!(code, Some(5), "a run whose command was stopped unguarded");
        // Continued, it says why its command stopped (an operator's trial:
        // when the run's end was seen first, it said only that the run
        // ended).
        assert!(
            said.contains("gave its keeper no sign"),
            "not said that the keeper stopped the command: {said}"
        );
    });
}

/// Found by the nemesis: a `run` frozen past its keeper's bound (its
/// command stopped) whose run faulted meanwhile (its required node
/// killed) printed `run_faulted` once continued, then exited 5 (not
/// guarded) rather than 3 (the run faulted), depending on which it
/// noticed first. The fault came first: it exits 3.
#[test]
fn a_frozen_run_whose_run_faulted_meanwhile_prints_the_fault_and_exits_3() {
    need_etcd!();
    live_for(LIMIT, async {
        let server = etcd::Etcd::start("frozen-faulted");
        let proxy = etcd::Proxy::start(server.port());
        let (mut cluster, replica, live, requester) =
            among_replicas(&server, &proxy, 2, Duration::from_secs(2)).await;
        let mut events = live.gate.subscribe();
        let (mut run, pid_file) = guarded_run_of(&cluster, &requester, &["--require", "node-1"]);
        let mut lines = BufReader::new(run.stdout.take().unwrap()).lines();
        until_line(&mut lines, "run_committed").await;
        let group = group_of(&pid_file).await;
        let pid = Pid::from_raw(run.id().unwrap() as i32);
        kill(pid, Signal::SIGSTOP).unwrap();
        // Its required node goes while it is frozen: the leader faults
        // the run.
        cluster.kill(0);
        let faulted = tokio::time::timeout(Duration::from_secs(10), async {
            while let Some(event) = events.recv().await {
                if matches!(event, poolgate::core::Event::RunFaulted { .. }) {
                    return true;
                }
            }
            false
        })
        .await;
        // Past the keeper's bound (half of unguarded_after): it stopped
        // the command too.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        kill(pid, Signal::SIGCONT).unwrap();
        let code = exit_code(&mut run).await;
        let mut printed = Vec::new();
        while let Ok(Ok(Some(line))) =
            tokio::time::timeout(Duration::from_secs(1), lines.next_line()).await
        {
            printed.push(line);
        }
        kill_group(group);
        live.stop().await;
        replica.resign();
        assert_eq!(faulted, Ok(true), "the leader faulted the run");
        assert!(
            printed.iter().any(|l| l.contains("run_faulted")),
            "{printed:?}"
        );
        assert_eq!(
            code,
            Some(3),
            "printed the fault, then exited {code:?}: {printed:?}"
        );
    });
}

/// An operator's finding: a `run` cut off from etcd stopped its command
/// only after `[run] unguarded_after` unconfirmed, but its session (that
/// TTL, renewed every third of it) could expire, and the leader end its
/// run and commit another requester's run on the same nodes, a third of
/// the TTL earlier: two commands ran at once for up to 2.8 s. `run` now
/// stops its command once its session is at risk (not renewed for half
/// the TTL), before the leader can end the run.
#[test]
fn a_run_cut_from_etcd_has_its_command_stopped_before_the_leader_ends_its_run() {
    need_etcd!();
    live_for(LIMIT, async {
        let (alive, code, _) =
            away_until_ended("cut-requester", Away::Cut, Duration::from_secs(4)).await;
        assert!(
            !alive,
            "the command still ran when the leader ended its run"
        );
        assert_eq!(code, Some(5));
    });
}

/// A lone `run` with `[run] unguarded_after` of 2 s (its watchdog's
/// bound 1 s), its run committed over node-1: the cluster, `run`, its
/// output and its command's group.
async fn lone_run_committed() -> (LocalCluster, tokio::process::Child, Lines, Pid) {
    let mut plan = plan(2, None);
    plan.base.run.unguarded_after = Duration::from_secs(2);
    let cluster = cluster(&plan).await;
    let (mut run, pid_file) = guarded_run(&cluster, &["--require", "node-1"]);
    let mut lines = BufReader::new(run.stdout.take().unwrap()).lines();
    until_line(&mut lines, "run_committed").await;
    let group = group_of(&pid_file).await;
    (cluster, run, lines, group)
}

/// An operator's finding: a keeper stopped (SIGSTOP) for more than the
/// watchdog's bound, and continued, stopped a healthy run's command at
/// once, blaming `run`: it judged its guard on time it had lost itself.
/// A keeper that finds itself late waits a little for the signs sent
/// meanwhile before it judges.
#[test]
fn a_keeper_stopped_past_its_bound_and_continued_leaves_a_healthy_command_alone() {
    live_for(LIMIT, async {
        let (_cluster, mut run, _lines, group) = lone_run_committed().await;
        let keeper = keeper_of(&run).await;
        let pid = Pid::from_raw(run.id().unwrap() as i32);
        kill(keeper, Signal::SIGSTOP).unwrap();
        // Past the watchdog's bound (half of unguarded_after: 1 s).
        tokio::time::sleep(Duration::from_millis(1500)).await;
        kill(keeper, Signal::SIGCONT).unwrap();
        // What the keeper would do on waking shows within a second.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let alive = killpg(group, None).is_ok();
        let still_running = run.try_wait().unwrap().is_none();
        let _ = kill(pid, Signal::SIGTERM);
        let code = exit_code(&mut run).await;
        kill_group(group);
        assert!(
            alive,
            "the keeper stopped a healthy command (run exited {code:?})"
        );
        assert!(still_running, "run ended (exit {code:?})");
        assert_eq!(code, Some(143));
    });
}

/// The same for a lone `run` (its own gate guards the run): frozen, it
/// guards nothing, and its keeper stops the command after half of
/// `[run] unguarded_after` (2 s here) without a sign; continued, `run`
/// ends its run and exits 5.
#[test]
fn a_frozen_lone_run_has_its_command_stopped_and_exits_5() {
    live_for(LIMIT, async {
        let (_cluster, mut run, mut lines, group) = lone_run_committed().await;
        let pid = Pid::from_raw(run.id().unwrap() as i32);
        kill(pid, Signal::SIGSTOP).unwrap();
        let gone = group_gone(group).await;
        kill(pid, Signal::SIGCONT).unwrap();
        let finished = until_line(&mut lines, "run_finished").await;
        let code = exit_code(&mut run).await;
        kill_group(group);
        assert!(gone, "the command of a frozen run ran on");
        assert_eq!(code, Some(5), "{finished}");
    });
}

/// Status everywhere (design §15): the leader publishes what blocks the
/// pool; a `run` among replicas that gives up says it (before: "the pool
/// was not ready, or no replica led"), and a follower's `status` tells it
/// (before: no nodes, `run: none`, and nothing of the pool).
#[test]
fn a_requester_that_gives_up_and_a_follower_tell_what_blocks_the_pool() {
    need_etcd!();
    let server = etcd::Etcd::start("told");
    let proxy = etcd::Proxy::start(server.port());
    live_for(LIMIT, async {
        let (mut cluster, replica, live, requester) =
            among_replicas(&server, &proxy, 2, Duration::from_secs(10)).await;
        cluster.kill(0);
        until_forming(&live.gate).await;
        let gave_up = tokio::process::Command::new(env!("CARGO_BIN_EXE_poolgate"))
            .arg("run")
            .arg("--config")
            .arg(&requester)
            .args(["--timeout", "3s", "--", "true"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .output()
            .await
            .unwrap();
        let said = String::from_utf8_lossy(&gave_up.stderr);
        assert_eq!(gave_up.status.code(), Some(1), "{said}");
        assert!(
            said.contains("forming: node-1 "),
            "the requester names what blocks the pool: {said}"
        );
        // Since when, as a UTC time: the gate's own timeline ("since
        // 92.233s") read as a duration (an operator's trial).
        let utc_since = |line: &str| {
            line.split("(since ")
                .nth(1)
                .is_some_and(|rest| rest.starts_with("20") && rest.contains("Z)"))
        };
        assert!(utc_since(&said), "{said}");
        let mut second = cluster.config.clone();
        second.agents.listen = free_tcp();
        second.swim.bind = {
            let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            socket.local_addr().unwrap()
        };
        let mut follower = poolgate::ha::replica::Replica::start(&second).unwrap();
        let following = actix::spawn(async move {
            let _ = follower.lead(None).await;
        });
        let answer = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                if let Ok(answer) = poolgate::live::status::ask(second.agents.listen).await {
                    return answer;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await
        .expect("the follower answers");
        assert_eq!(answer["phase"], "following", "{answer}");
        let state = answer["leader_said"]["state"].as_str().unwrap_or_default();
        assert!(state.contains("forming: node-1 "), "{answer}");
        assert!(utc_since(state), "{answer}");
        assert_eq!(answer["leader_said"]["phase"], "forming", "{answer}");
        assert!(
            poolgate::live::status::render(&answer).contains("the leader published"),
            "{answer}"
        );
        following.abort();
        live.stop().await;
        replica.resign();
    });
}

/// Issue 28, reproduction 2: a `run` paused for 4 s (SIGSTOP) lost its
/// 2 s session; the run's outcome went with it, and a fault afterwards
/// never stopped the command. The session now rides through such a
/// pause, and the fault stops the command (exit 3).
#[test]
fn a_run_paused_for_4s_still_stops_its_command_when_its_run_faults() {
    need_etcd!();
    let server = etcd::Etcd::start("paused-run");
    let proxy = etcd::Proxy::start(server.port());
    live_for(LIMIT, async {
        let (mut cluster, replica, live, requester) =
            among_replicas(&server, &proxy, 2, Duration::from_secs(10)).await;
        let (mut run, pid_file) = guarded_run_of(&cluster, &requester, &["--require", "node-1"]);
        let mut lines = BufReader::new(run.stdout.take().unwrap()).lines();
        until_line(&mut lines, "run_committed").await;
        let group = group_of(&pid_file).await;
        let pid = Pid::from_raw(run.id().unwrap() as i32);
        kill(pid, Signal::SIGSTOP).unwrap();
        tokio::time::sleep(Duration::from_secs(4)).await;
        kill(pid, Signal::SIGCONT).unwrap();
        cluster.kill(0);
        until_line(&mut lines, "run_faulted").await;
        assert_eq!(exit_code(&mut run).await, Some(3));
        let gone = group_gone(group).await;
        kill_group(group);
        assert!(gone, "the command outlived its faulted run");
        live.stop().await;
        replica.resign();
    });
}

/// Issue 28, reproduction 6: with both replicas in `[orchestrator] agents`
/// (the follower listed first), one reset of a healthy node's connection
/// faulted the run 10 times in 10: the node tried the follower, was
/// refused, and came back after the orchestrator's grace. A node now
/// tries the replica it was connected to first, so a reset faults
/// nothing.
#[test]
fn a_reset_of_a_healthy_nodes_connection_faults_nothing_with_two_replicas_listed() {
    need_etcd!();
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("skipped: resetting another process's connection (ss -K) needs root");
        return;
    }
    let server = etcd::Etcd::start("reset");
    live_for(LIMIT, async {
        let mut plan = plan(2, None);
        plan.base.state.etcd = vec![server.endpoint.clone()];
        plan.base.state.lease = Duration::from_secs(2);
        plan.base.state.insecure = true;
        let mut cluster = LocalCluster::prepare(&plan).await.unwrap();
        let mut leader = poolgate::ha::replica::Replica::start(&cluster.config).unwrap();
        let live = leader.lead(None).await.unwrap();
        let mut second = cluster.config.clone();
        second.agents.listen = free_tcp();
        second.swim.bind = {
            let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            socket.local_addr().unwrap()
        };
        let mut follower = poolgate::ha::replica::Replica::start(&second).unwrap();
        let following = actix::spawn(async move {
            let _ = follower.lead(None).await;
        });
        // Every node lists the follower first, then the leader.
        let (f, l) = (second.agents.listen, cluster.config.agents.listen);
        for node in &cluster.nodes {
            let text = std::fs::read_to_string(&node.config).unwrap();
            let listed = text.replace(
                &format!("agents = \"{l}\""),
                &format!("agents = [\"{f}\", \"{l}\"]"),
            );
            assert_ne!(text, listed, "the node's agents line");
            std::fs::write(&node.config, listed).unwrap();
        }
        for i in 0..cluster.nodes.len() {
            cluster.spawn(i).unwrap();
        }
        let mut events = live.gate.subscribe();
        let proof = live.gate.wait_ready().await.unwrap();
        let run = poolgate::core::RunId::new("reset").unwrap();
        let node = poolgate::core::NodeId::new("node-1").unwrap();
        live.gate
            .begin_planning(run.clone(), Some(proof.epoch))
            .await
            .unwrap();
        live.gate
            .commit_plan(run.clone(), vec![node], Some(proof.epoch))
            .await
            .unwrap();
        // Each node's connection to the leader, reset from the node's side.
        let reset = std::process::Command::new("ss")
            .args([
                "-K",
                "dst",
                "127.0.0.1",
                "dport",
                "=",
                &l.port().to_string(),
            ])
            .output()
            .unwrap();
        assert!(
            String::from_utf8_lossy(&reset.stdout).contains(&l.to_string()),
            "no connection reset: {}",
            String::from_utf8_lossy(&reset.stdout)
        );
        // Three times the orchestrator's grace: the run is still guarded.
        let faulted = tokio::time::timeout(Duration::from_secs(2), async {
            loop {
                match events.recv().await {
                    Some(poolgate::core::Event::RunFaulted { node, reason, .. }) => {
                        return format!("{node} {reason}")
                    }
                    Some(_) => continue,
                    None => return "the gate stopped".to_string(),
                }
            }
        })
        .await;
        assert!(faulted.is_err(), "a reset faulted the run: {faulted:?}");
        assert_eq!(live.gate.report().await.unwrap().run, Some(run));
        following.abort();
        live.stop().await;
        leader.resign();
    });
}

/// A TCP port on 127.0.0.1 that was free a moment ago.
fn free_tcp() -> std::net::SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap()
}

/// The keeper (`poolgate guard-exec`) of `run`'s command: `run`'s child.
async fn keeper_of(run: &tokio::process::Child) -> Pid {
    let pid = run.id().unwrap();
    loop {
        let found = children(pid).into_iter().find(|p| {
            std::fs::read(format!("/proc/{p}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains("guard-exec"))
        });
        if let Some(keeper) = found {
            return Pid::from_raw(keeper as i32);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Issue 28, reproduction 9: SIGKILL of the keeper left the command
/// running under init while `run` exited 137 and ended the run. Whatever
/// kills the keeper, the command's whole group goes too.
#[test]
fn a_sigkilled_keeper_takes_the_commands_group_with_it() {
    live_for(LIMIT, async {
        let cluster = cluster(&plan(2, None)).await;
        let (mut run, pid_file) = guarded_run(&cluster, &["--require", "node-1"]);
        let mut lines = BufReader::new(run.stdout.take().unwrap()).lines();
        until_line(&mut lines, "run_committed").await;
        let group = group_of(&pid_file).await;
        kill(keeper_of(&run).await, Signal::SIGKILL).unwrap();
        let code = exit_code(&mut run).await;
        let gone = group_gone(group).await;
        kill_group(group);
        assert!(
            gone,
            "the command outlived its killed keeper (run exited {code:?})"
        );
        // Not 137, the keeper's death (an operator's finding): the
        // command was stopped unguarded.
        assert_eq!(code, Some(5));
    });
}

/// What is stopped (SIGSTOP) before the run faults.
#[derive(Clone, Copy)]
enum Stopped {
    /// The command's keeper (`guard-exec`).
    Keeper,
    /// The command's whole process group.
    Command,
}

/// A guarded run whose keeper or command is stopped, then faulted (its
/// node killed): whether the command's group was still there when `run`
/// exited, `run`'s exit code, and how long after `run_faulted` it came.
async fn faulted_while_stopped(what: Stopped) -> (bool, Option<i32>, Duration) {
    let mut cluster = cluster(&plan(2, None)).await;
    let (mut run, pid_file) = guarded_run(&cluster, &["--require", "node-1"]);
    let mut lines = BufReader::new(run.stdout.take().unwrap()).lines();
    until_line(&mut lines, "run_committed").await;
    let group = group_of(&pid_file).await;
    let keeper = keeper_of(&run).await;
    match what {
        Stopped::Keeper => kill(keeper, Signal::SIGSTOP).unwrap(),
        Stopped::Command => killpg(group, Signal::SIGSTOP).unwrap(),
    }
    cluster.kill(0);
    until_line(&mut lines, "run_faulted").await;
    let faulted = std::time::Instant::now();
    let code = exit_code(&mut run).await;
    let after = faulted.elapsed();
    let alive = killpg(group, None).is_ok();
    kill_group(group);
    let _ = kill(keeper, Signal::SIGKILL);
    let _ = kill(keeper, Signal::SIGCONT);
    (alive, code, after)
}

/// Issue 28, reproduction 9: with the keeper stopped (SIGSTOP), a fault
/// made `run` exit 3 as if it had stopped the command; it had not. Then
/// (an operator's finding) the command was stopped, but only once the
/// stopped keeper had been given the grace and two seconds more: it ran
/// on for 7 s after its run faulted. A stopped keeper is woken to do its
/// work: the command gets its SIGTERM at the fault, and `run` (whose
/// command leaves at SIGTERM) is done well within the grace (5 s).
#[test]
fn a_stopped_keeper_does_not_keep_the_command_past_a_fault() {
    live_for(LIMIT, async {
        let (alive, code, after) = faulted_while_stopped(Stopped::Keeper).await;
        assert!(!alive, "run exited {code:?} while its command still ran");
        assert_eq!(code, Some(3));
        assert!(
            after < Duration::from_secs(3),
            "the command ran on {after:?} after its run faulted"
        );
    });
}

/// A command stopped (SIGSTOP to its group) when its run faults: SIGTERM
/// stays pending on a stopped process, so the group waited out the grace
/// for its SIGKILL. It is continued with its SIGTERM and gone at once.
#[test]
fn a_stopped_command_is_stopped_at_the_fault_not_a_grace_later() {
    live_for(LIMIT, async {
        let (alive, code, after) = faulted_while_stopped(Stopped::Command).await;
        assert!(!alive, "run exited {code:?} while its command still ran");
        assert_eq!(code, Some(3));
        assert!(
            after < Duration::from_secs(3),
            "the stopped command went {after:?} after its run faulted"
        );
    });
}

/// Nemesis finding: a `run` paused while the leader committed its run, and
/// paused past its session, found the run ended by the leader (its
/// requester gone) and exited 3 as if it had faulted, printing no
/// `run_faulted`. Its command never ran: it exits 5 and says why.
#[test]
fn a_run_ended_by_the_leader_while_its_requester_was_away_exits_5_not_3() {
    need_etcd!();
    let server = etcd::Etcd::start("away");
    let proxy = etcd::Proxy::start(server.port());
    live_for(LIMIT, async {
        // A 5 s session: the commit (node-1 back, one window) comes well
        // within it, its expiry after.
        let (mut cluster, replica, live, requester) =
            among_replicas(&server, &proxy, 2, Duration::from_secs(5)).await;
        // Not ready: the run is asked, not committed.
        cluster.kill(0);
        until_forming(&live.gate).await;
        let (mut run, pid_file) = guarded_run_of(&cluster, &requester, &["--require", "node-1"]);
        let requests = format!("/poolgate/{}/guard/requests/", cluster.config.swim.label);
        tokio::time::timeout(Duration::from_secs(10), async {
            while server
                .client()
                .get_prefix(requests.as_bytes())
                .unwrap()
                .is_empty()
            {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .expect("the run is asked");
        let pid = Pid::from_raw(run.id().unwrap() as i32);
        kill(pid, Signal::SIGSTOP).unwrap();
        // Committed while it is away; then its session (5 s) expires and
        // the leader ends the run.
        cluster.spawn(0).unwrap();
        let mut events = live.gate.subscribe();
        until_ended_by_the_leader(&mut events).await;
        kill(pid, Signal::SIGCONT).unwrap();
        assert_eq!(exit_code(&mut run).await, Some(5));
        assert!(
            !pid_file.exists(),
            "the command of a run that was never seen committed was started"
        );
        live.stop().await;
        replica.resign();
    });
}

/// Nemesis finding: a `run` whose session expired before its run was
/// committed (paused past it) waited forever: its request had gone with
/// the session, so nobody would ever commit it. It exits 5.
#[test]
fn a_run_whose_session_expired_before_its_commit_exits_5() {
    need_etcd!();
    let server = etcd::Etcd::start("lapsed");
    let proxy = etcd::Proxy::start(server.port());
    live_for(LIMIT, async {
        let (mut cluster, replica, live, requester) =
            among_replicas(&server, &proxy, 2, Duration::from_secs(2)).await;
        cluster.kill(0);
        let (mut run, pid_file) = guarded_run_of(&cluster, &requester, &["--require", "node-1"]);
        let alive = format!("/poolgate/{}/guard/alive/", cluster.config.swim.label);
        let present = || {
            !server
                .client()
                .get_prefix(alive.as_bytes())
                .unwrap()
                .is_empty()
        };
        tokio::time::timeout(Duration::from_secs(10), async {
            while !present() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .expect("the run is asked");
        let pid = Pid::from_raw(run.id().unwrap() as i32);
        kill(pid, Signal::SIGSTOP).unwrap();
        tokio::time::timeout(Duration::from_secs(10), async {
            while present() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await
        .expect("the paused requester's session expires");
        kill(pid, Signal::SIGCONT).unwrap();
        assert_eq!(exit_code(&mut run).await, Some(5));
        assert!(!pid_file.exists(), "a command started");
        live.stop().await;
        replica.resign();
    });
}

/// Nemesis finding: a `run` whose sockets another process on its host
/// holds (beside a `watch`) campaigned anyway, won the leader key when
/// it fell free, and held it for a lease with nobody acting. It only
/// asks: the key stays free for a replica that can act.
#[test]
fn a_run_that_cannot_bind_its_sockets_never_takes_the_leader_key() {
    need_etcd!();
    let server = etcd::Etcd::start("no-campaign");
    let proxy = etcd::Proxy::start(server.port());
    live_for(LIMIT, async {
        let (cluster, replica, live, requester) =
            among_replicas(&server, &proxy, 2, Duration::from_secs(10)).await;
        let (mut run, pid_file) = guarded_run_of(&cluster, &requester, &["--require", "node-1"]);
        let mut lines = BufReader::new(run.stdout.take().unwrap()).lines();
        until_line(&mut lines, "run_committed").await;
        let group = group_of(&pid_file).await;
        // The replica that could act goes (its lease revoked at once).
        live.stop().await;
        replica.resign();
        let leader = format!("/poolgate/{}/guard/leader", cluster.config.swim.label);
        let until = std::time::Instant::now() + Duration::from_secs(3);
        while std::time::Instant::now() < until {
            let held = server.client().get(leader.as_bytes()).unwrap();
            assert!(held.is_none(), "the run took the leader key: {held:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let _ = kill(Pid::from_raw(run.id().unwrap() as i32), Signal::SIGTERM);
        let _ = exit_code(&mut run).await;
        let gone = group_gone(group).await;
        kill_group(group);
        assert!(gone);
    });
}
