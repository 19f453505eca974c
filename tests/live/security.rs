//! Nobody gets in who does not belong (design §8), tried for real: node
//! processes on 127.0.0.1, orchestrators in this process or as
//! `poolgate watch` (whose own metrics are scraped), hostile members,
//! frames and floods. Each test gives up after 60 s; every process it
//! started is reaped.

use std::io::Write as _;
use std::net::SocketAddr;
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::common::live::{live_for, ready, until};
use crate::common::{self, node};
use nix::sys::signal::Signal;
use poolgate::cli::cluster::{ClusterPlan, LocalCluster};
use poolgate::core::{Blocker, Event, RunId};
use poolgate::live::keys::{ClusterKey, NodeKey};
use poolgate::live::swim::member::{boot_generation, Join};
use poolgate::live::swim::SwimMember;
use poolgate::live::wire::{self, Announcement, Keyring};
use poolgate::live::Orchestrator;
use poolgate::Config;
use rand::rngs::StdRng;
use rand::SeedableRng;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

const BASE: &str = r#"
[pool]
id = "secure"
members = ["unused"]
[readiness]
convergence_window = "300ms"
[planning]
on_readiness_lost = "wait"
[swim]
probe_period = "200ms"
probe_rtt = "60ms"
suspicion_timeout = "1s"
[agents]
max_connections = 64
idle_timeout = "2s"
"#;

const LIMIT: Duration = Duration::from_secs(60);

fn plan(nodes: u32, external: bool) -> ClusterPlan {
    let mut plan = common::live::plan(BASE, nodes);
    plan.seed = 9;
    plan.external_orchestrator = external;
    plan
}

fn live<F: std::future::Future<Output = ()>>(test: F) {
    live_for(LIMIT, test);
}

/// Rewrites `cluster_keys = [...]` in a node's config.
fn set_node_keys(config: &std::path::Path, keys: &[&std::path::Path]) {
    let text = std::fs::read_to_string(config).unwrap();
    let list: Vec<String> = keys
        .iter()
        .map(|k| serde_json::to_string(&k.display().to_string()).unwrap())
        .collect();
    let text: String = text
        .lines()
        .map(|line| {
            if line.starts_with("cluster_keys") {
                format!("cluster_keys = [{}]\n", list.join(", "))
            } else {
                format!("{line}\n")
            }
        })
        .collect();
    std::fs::write(config, text).unwrap();
}

/// `poolgate watch` on the cluster's orchestrator.toml, with its metrics
/// served on a free port.
struct Watch {
    child: tokio::process::Child,
    metrics: SocketAddr,
}

impl Watch {
    fn start(cluster: &LocalCluster, log: Option<&str>) -> Watch {
        let metrics = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_poolgate"));
        if let Some(level) = log {
            command.env("RUST_LOG", level);
        }
        let child = command
            .arg("watch")
            .arg("--config")
            .arg(&cluster.config_file)
            .args(["--json", "--timeout", "55s", "--metrics"])
            .arg(metrics.to_string())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(cluster.dir.join("watch.log")).unwrap())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        Watch { child, metrics }
    }

    /// The sum of a metric's samples (every label set whose line starts
    /// with `name`), once it is served.
    async fn metric(&self, name: &str) -> f64 {
        loop {
            if let Ok(mut stream) = tokio::net::TcpStream::connect(self.metrics).await {
                stream
                    .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                    .await
                    .unwrap();
                let mut text = String::new();
                let _ = stream.read_to_string(&mut text).await;
                if text.starts_with("HTTP/1.1 200") {
                    return text
                        .lines()
                        .filter(|l| l.starts_with(name))
                        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                        .sum();
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until `metric` reaches `at_least` (or gives up at the limit).
    async fn until_metric(&self, name: &str, at_least: f64) -> f64 {
        loop {
            let value = self.metric(name).await;
            if value >= at_least {
                return value;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until every metric of `wanted` has its value (the condition,
    /// not a fixed wait; the test's own bound ends a wait that never ends).
    async fn until_metrics(&self, wanted: &[(&str, f64)]) {
        loop {
            let mut all = true;
            for (name, value) in wanted {
                all &= self.metric(name).await == *value;
            }
            if all {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn rss_kib(&self) -> u64 {
        let pid = self.child.id().unwrap();
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    }
}

/// Watch's events, line by line.
type Events = tokio::io::Lines<BufReader<tokio::process::ChildStdout>>;

/// `plan`'s cluster with every node started, under `poolgate watch`,
/// once its pool is ready; watch's events from there.
async fn ready_under_watch(plan: &ClusterPlan) -> (LocalCluster, Watch, Events) {
    let mut cluster = LocalCluster::prepare(plan).await.unwrap();
    let mut watch = Watch::start(&cluster, None);
    let mut events = BufReader::new(watch.child.stdout.take().unwrap()).lines();
    for i in 0..cluster.nodes.len() {
        cluster.spawn(i).unwrap();
    }
    until_line(&mut events, &["\"pool_ready\""]).await;
    (cluster, watch, events)
}

/// A second `poolgate node` with the cluster's first node's config and
/// key (a copied config), its stderr to `stderr`.
fn copy_of_node(cluster: &LocalCluster, stderr: Stdio) -> tokio::process::Child {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_poolgate"))
        .arg("node")
        .arg("--config")
        .arg(&cluster.nodes[0].config)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

/// Reads `lines` (watch's events) until one holds every one of `needles`;
/// every line read, that one last.
async fn read_until(lines: &mut Events, needles: &[&str]) -> Vec<String> {
    let mut read = Vec::new();
    loop {
        let line = lines
            .next_line()
            .await
            .unwrap()
            .expect("watch prints events");
        let found = needles.iter().all(|n| line.contains(n));
        read.push(line);
        if found {
            return read;
        }
    }
}

/// Reads `lines` (watch's events) until one holds every one of `needles`;
/// that line.
async fn until_line(lines: &mut Events, needles: &[&str]) -> String {
    read_until(lines, needles).await.pop().unwrap_or_default()
}

#[test]
fn a_node_with_a_wrong_cluster_key_never_becomes_live_and_its_datagrams_are_counted() {
    live(async {
        let mut cluster = LocalCluster::prepare(&plan(2, true)).await.unwrap();
        let wrong = cluster.dir.join("wrong.key");
        ClusterKey::generate().save(&wrong).unwrap();
        set_node_keys(&cluster.nodes[1].config, &[&wrong]);
        let watch = Watch::start(&cluster, None);
        cluster.spawn(0).unwrap();
        cluster.spawn(1).unwrap();
        watch
            .until_metric("poolgate_gossip_rejected_total", 5.0)
            .await;
        // node-1 is live; node-2 announced itself (signed, accepted) but
        // SWIM never saw it: it is blocked as not live, nothing else.
        let settled = [
            ("poolgate_candidates_blocked{condition=\"not_live\"}", 1.0),
            (
                "poolgate_candidates_blocked{condition=\"not_available\"}",
                0.0,
            ),
        ];
        watch.until_metrics(&settled).await;
        // And stays so while its datagrams keep being refused.
        let rejected = watch.metric("poolgate_gossip_rejected_total").await;
        watch
            .until_metric("poolgate_gossip_rejected_total", rejected + 2.0)
            .await;
        assert_eq!(
            watch
                .metric("poolgate_candidates_blocked{condition=\"not_live\"}")
                .await,
            1.0
        );
    });
}

#[test]
fn a_node_whose_signing_key_is_not_the_pinned_one_is_refused_and_stays_unavailable() {
    live(async {
        let mut cluster = LocalCluster::prepare(&plan(2, true)).await.unwrap();
        let key = cluster.dir.join("node-2.key");
        std::fs::remove_file(&key).unwrap();
        NodeKey::generate().save(&key).unwrap();
        let watch = Watch::start(&cluster, None);
        cluster.spawn(0).unwrap();
        cluster.spawn(1).unwrap();
        watch
            .until_metric(
                "poolgate_agent_frames_refused_total{reason=\"bad_signature\"}",
                1.0,
            )
            .await;
        // node-1 counts (ready: nothing blocks it), node-2 refused: it is
        // not available and has no identity, and stays so as its frames
        // keep being refused.
        let refused = [
            (
                "poolgate_candidates_blocked{condition=\"not_available\"}",
                1.0,
            ),
            (
                "poolgate_candidates_blocked{condition=\"no_identity\"}",
                1.0,
            ),
        ];
        watch.until_metrics(&refused).await;
        watch
            .until_metric(
                "poolgate_agent_frames_refused_total{reason=\"bad_signature\"}",
                2.0,
            )
            .await;
        watch.until_metrics(&refused).await;
    });
}

/// An orchestrator's config for one node, `n1`, pinned to `key`; gossip
/// in the clear (these tests speak to the agent listener only).
fn one_node_orchestrator(key: &NodeKey) -> Config {
    let mut config = Config::parse(BASE, "frames-test").unwrap();
    config.pool = poolgate::core::PoolDefinition::new(
        poolgate::core::PoolId::new("p").unwrap(),
        vec![node("n1")],
    )
    .unwrap();
    config.registry.insert(node("n1"), key.public());
    config.swim.insecure = true;
    config.agents.listen = "127.0.0.1:0".parse().unwrap();
    config
}

/// Writes `frame` on a new connection; whether the orchestrator closed it
/// (a refusal closes the connection, an accepted frame does not).
/// Sends one frame on a new connection: whether it was refused (the
/// orchestrator acknowledges each frame it accepts).
async fn send(agents: SocketAddr, frame: &[u8]) -> bool {
    let mut stream = tokio::net::TcpStream::connect(agents).await.unwrap();
    stream.write_all(frame).await.unwrap();
    let reply = tokio::time::timeout(Duration::from_secs(2), wire::read_reply(&mut stream)).await;
    !matches!(reply, Ok(Ok(Some(wire::Reply::Accepted { .. }))))
}

/// What node n1 announces: its identity material, `available` or not.
fn n1_state(available: bool) -> Announcement {
    Announcement {
        available,
        identity: Some(wire::identity_text(b"n1 material")),
        swim: None,
        generation: None,
        fault: None,
        leaving: false,
        heartbeat_ms: None,
        ask: None,
    }
}

/// One announcement on a new connection, as a node makes it: the first
/// frame asks for the connection's challenge, then the same, signed over
/// it. `None` when accepted, else what was answered; and the frame signed
/// over the challenge (what someone on the path would capture).
async fn announce_once(
    agents: SocketAddr,
    key: &NodeKey,
    label: &str,
    node: &str,
    seq: u64,
    state: &Announcement,
) -> (Option<String>, Vec<u8>) {
    let mut stream = tokio::net::TcpStream::connect(agents).await.unwrap();
    stream
        .write_all(&wire::encode(key, label, node, seq, None, state))
        .await
        .unwrap();
    let reply = tokio::time::timeout(Duration::from_secs(2), wire::read_reply(&mut stream)).await;
    let nonce = match reply {
        Ok(Ok(Some(wire::Reply::Challenge { nonce }))) => wire::challenge_nonce(&nonce).unwrap(),
        other => return (Some(format!("{other:?}")), Vec::new()),
    };
    let bound = wire::encode(key, label, node, seq, Some(&nonce), state);
    stream.write_all(&bound).await.unwrap();
    let reply = tokio::time::timeout(Duration::from_secs(2), wire::read_reply(&mut stream)).await;
    match reply {
        Ok(Ok(Some(wire::Reply::Accepted { .. }))) => (None, bound),
        other => (Some(format!("{other:?}")), bound),
    }
}

#[test]
fn a_frame_captured_before_a_restart_without_a_state_file_is_refused_after_it() {
    // Issue 28, reproduction 11: without a state file an orchestrator
    // restarted remembers no sequence, and an agent frame captured before
    // the restart was accepted after it. Frames are bound to the
    // connection's challenge now: what was captured opens nowhere else.
    let key = NodeKey::generate();
    let config = one_node_orchestrator(&key);
    assert!(config.state.path.is_none());
    let state = n1_state(true);
    let (first, captured) = {
        let (config, signer, announced) = (config.clone(), key.clone(), state.clone());
        let captured = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let keep = std::sync::Arc::clone(&captured);
        live(async move {
            let live = Orchestrator::start(&config).await.unwrap();
            let (answer, bound) =
                announce_once(live.agents_addr, &signer, "poolgate", "n1", 5, &announced).await;
            assert_eq!(answer, None, "accepted in the first life");
            *keep.lock().unwrap() = bound;
            live.stop().await;
        });
        let first = wire::encode(&key, "poolgate", "n1", 5, None, &state);
        let captured = captured.lock().unwrap().clone();
        (first, captured)
    };
    live(async move {
        let live = Orchestrator::start(&config).await.unwrap();
        let not_available = |report: poolgate::core::PoolReport| {
            report.candidates[0].verdict.has(Blocker::NotAvailable)
        };
        // Both captured frames on one connection, as the node sent them.
        let mut stream = tokio::net::TcpStream::connect(live.agents_addr)
            .await
            .unwrap();
        stream.write_all(&first).await.unwrap();
        let challenge = wire::read_reply(&mut stream).await;
        assert!(
            matches!(challenge, Ok(Some(wire::Reply::Challenge { .. }))),
            "{challenge:?}"
        );
        stream.write_all(&captured).await.unwrap();
        match wire::read_reply(&mut stream).await {
            Ok(Some(wire::Reply::Refused { code, .. })) => assert_eq!(code, "bad_signature"),
            other => panic!("the captured frame was not refused: {other:?}"),
        }
        assert!(
            not_available(live.gate.report().await.unwrap()),
            "nothing of the captured frames was applied"
        );
        live.stop().await;
    });
}

#[test]
fn a_replayed_frame_and_an_older_sequence_are_refused_and_change_nothing() {
    live(async {
        let key = NodeKey::generate();
        let config = one_node_orchestrator(&key);
        let live = Orchestrator::start(&config).await.unwrap();
        let available = n1_state;
        let up = wire::encode(&key, "poolgate", "n1", 5, None, &available(true));
        let older = wire::encode(&key, "poolgate", "n1", 3, None, &available(true));
        let blocked = |report: poolgate::core::PoolReport| {
            report.candidates[0].verdict.has(Blocker::NotAvailable)
        };
        let agents = live.agents_addr;
        let (answer, bound_up) =
            announce_once(agents, &key, "poolgate", "n1", 5, &available(true)).await;
        assert_eq!(answer, None, "accepted");
        assert!(!blocked(live.gate.report().await.unwrap()));
        let (answer, _) = announce_once(agents, &key, "poolgate", "n1", 6, &available(false)).await;
        assert_eq!(answer, None, "accepted");
        assert!(blocked(live.gate.report().await.unwrap()));
        // The "available" frame captured after the challenge, sent first
        // on a connection of its own: signed over another connection's
        // challenge, it opens on none.
        assert!(send(agents, &bound_up).await, "a captured frame is refused");
        // The captured "available" frame, sent again; then an older one.
        // The refusal says nothing of the last accepted sequence (issue
        // 28, reproduction 11: it told whoever replayed a frame).
        let mut stream = tokio::net::TcpStream::connect(live.agents_addr)
            .await
            .unwrap();
        stream.write_all(&up).await.unwrap();
        match wire::read_reply(&mut stream).await {
            Ok(Some(wire::Reply::Refused { code, detail, .. })) => {
                assert_eq!(code, "replayed");
                assert!(!detail.contains('6') && !detail.contains('5'), "{detail}");
            }
            other => panic!("the replay was not refused: {other:?}"),
        }
        for (frame, what) in [(&up, "the replay"), (&older, "an older sequence")] {
            assert_eq!(
                refusal_code(live.agents_addr, frame).await.as_deref(),
                Some(wire::REPLAYED),
                "{what} is refused as a replay"
            );
        }
        assert!(
            blocked(live.gate.report().await.unwrap()),
            "nothing changed"
        );
        // A frame signed for another cluster label is refused as well.
        let other = wire::encode(&key, "other-cluster", "n1", 9, None, &available(true));
        assert!(send(live.agents_addr, &other).await);
        assert!(blocked(live.gate.report().await.unwrap()));
    });
}

#[test]
fn an_impostor_calling_itself_node_1_from_another_address_is_ignored_and_the_run_still_faults() {
    live(async {
        let mut cluster = LocalCluster::prepare(&plan(3, false)).await.unwrap();
        let orchestrator = cluster.orchestrator().unwrap();
        let gate = orchestrator.gate.clone();
        let seed = orchestrator.swim_addr;
        let mut events = gate.subscribe();
        for i in 0..3 {
            cluster.spawn(i).unwrap();
        }
        let epoch = ready(&mut events).await;
        let run = RunId::new("r").unwrap();
        gate.begin_planning(run.clone(), Some(epoch)).await.unwrap();
        gate.commit_plan(run.clone(), vec![node("node-1")], Some(epoch))
            .await
            .unwrap();
        // An insider with the cluster key claims node-1, at a newer
        // generation, from another address.
        let key = ClusterKey::load(&cluster.dir.join("cluster.key")).unwrap();
        let (impostor, _) = SwimMember::start(
            "node-1",
            "127.0.0.1:0".parse().unwrap(),
            None,
            boot_generation() + 1_000_000,
            cluster.config.swim.timings.foca_config(8),
            StdRng::seed_from_u64(1),
            None,
            Keyring::new(&[key], &cluster.config.swim.label),
        )
        .unwrap();
        impostor.do_send(Join { seeds: vec![seed] });
        // The impostor's claim is in the cluster: it knows the
        // orchestrator's member and the three nodes'.
        joined(&impostor, 3).await;
        cluster.kill(0);
        let faulted = until(&mut events, |e| match e {
            Event::RunFaulted { node, .. } => Some(node.clone()),
            _ => None,
        })
        .await;
        assert_eq!(faulted, node("node-1"));
    });
}

#[test]
fn rotating_the_cluster_key_keeps_the_pool_ready_throughout() {
    live(async {
        let mut cluster = LocalCluster::prepare(&plan(3, false)).await.unwrap();
        let gate = cluster.orchestrator().unwrap().gate.clone();
        let mut events = gate.subscribe();
        for i in 0..3 {
            cluster.spawn(i).unwrap();
        }
        ready(&mut events).await;
        let old = cluster.dir.join("cluster.key");
        let new = cluster.dir.join("cluster-2.key");
        ClusterKey::generate().save(&new).unwrap();
        // Install (both, old first), use (new first), remove (new only).
        for ring in [vec![&old, &new], vec![&new, &old], vec![&new]] {
            let ring: Vec<&std::path::Path> = ring.iter().map(|p| p.as_path()).collect();
            for i in 0..3 {
                set_node_keys(&cluster.nodes[i].config, &ring);
                cluster.signal(i, Signal::SIGHUP);
            }
            cluster.config.swim.cluster_keys = ring.iter().map(|p| p.to_path_buf()).collect();
            cluster
                .orchestrator()
                .unwrap()
                .reload_cluster_keys(&cluster.config.swim)
                .unwrap();
            tokio::time::sleep(Duration::from_millis(1500)).await;
        }
        let mut seen = Vec::new();
        while let Ok(event) = events.try_recv() {
            seen.push(event);
        }
        assert!(
            seen.is_empty(),
            "no readiness change during rotation: {seen:?}"
        );
        // Gossip still works under the new key alone: a crash is seen.
        cluster.kill(2);
        until(&mut events, |e| match e {
            Event::ReadinessLost { node: Some(n), .. } if *n == node("node-3") => Some(()),
            _ => None,
        })
        .await;
    });
}

/// Sends garbage datagrams to `target` for `span`, as fast as one thread
/// can or at most `per_second`; returns how many were sent.
fn flood(target: SocketAddr, span: Duration, per_second: Option<u64>) -> u64 {
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let started = Instant::now();
    let mut sent = 0u64;
    let mut garbage = [0u8; 1200];
    while started.elapsed() < span && sent < 50_000_000 {
        if let Some(rate) = per_second {
            let due = Duration::from_secs_f64(sent as f64 / rate as f64);
            if let Some(wait) = due.checked_sub(started.elapsed()) {
                std::thread::sleep(wait);
            }
        }
        garbage[..8].copy_from_slice(&sent.to_le_bytes());
        let size = 40 + (sent as usize * 7919) % 1160;
        let _ = socket.send_to(&garbage[..size], target);
        sent += 1;
    }
    sent
}

#[test]
fn garbage_datagrams_cost_cpu_never_memory_nor_a_state_change() {
    // The shipped SWIM timings, not the tests' tight ones.
    let mut plan = plan(2, true);
    plan.base.swim.timings.probe_period = Duration::from_millis(400);
    plan.base.swim.timings.probe_rtt = Duration::from_millis(120);
    plan.base.swim.timings.suspicion_timeout = Duration::from_secs(2);
    live(async {
        let (cluster, watch, mut lines) = ready_under_watch(&plan).await;
        let target = cluster.config.swim.bind;
        let before = watch.rss_kib();

        // 10 s at 20,000 garbage datagrams a second (some hundred times
        // the cluster's own gossip): not one readiness change.
        let steady =
            std::thread::spawn(move || flood(target, Duration::from_secs(10), Some(20_000)));
        let quiet = tokio::time::timeout(Duration::from_secs(10), lines.next_line()).await;
        assert!(quiet.is_err(), "an event during the flood: {quiet:?}");
        let sent = steady.join().unwrap();
        let rejected = watch.metric("poolgate_gossip_rejected_total").await;
        assert!(
            rejected >= sent as f64 * 0.9,
            "{rejected} of {sent} rejected"
        );

        // Then 5 s as fast as one thread can send: memory stays flat (what
        // the receiver cannot take is dropped by the kernel, unparsed).
        let full = std::thread::spawn(move || flood(target, Duration::from_secs(5), None));
        while !full.is_finished() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let sent = full.join().unwrap();
        let after = watch.rss_kib();
        assert!(
            after < before + 50 * 1024,
            "RSS {before} KiB → {after} KiB after {sent} datagrams"
        );
    });
}

#[test]
fn a_10_mb_frame_and_thousands_of_idle_connections_are_refused_or_closed_in_bounded_memory() {
    let (_, hard) =
        nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).unwrap();
    let _ = nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, hard, hard);
    live(async {
        let cluster = LocalCluster::prepare(&plan(1, true)).await.unwrap();
        let watch = Watch::start(&cluster, None);
        let agents = cluster.config.agents.listen;
        watch.metric("poolgate_").await; // serving
        let before = watch.rss_kib();

        // A 10 MB frame: refused at its length, connection closed.
        let mut stream = tokio::net::TcpStream::connect(agents).await.unwrap();
        let mut huge = 10_000_000u32.to_be_bytes().to_vec();
        huge.extend(vec![b'x'; 65_536]);
        let _ = stream.write_all(&huge).await;
        // Told why, then closed.
        let reply =
            tokio::time::timeout(Duration::from_secs(2), wire::read_reply(&mut stream)).await;
        assert!(
            matches!(&reply, Ok(Ok(Some(wire::Reply::Refused { code, .. }))) if code == "too_long"),
            "{reply:?}"
        );
        let mut byte = [0u8; 1];
        let closed = tokio::time::timeout(Duration::from_secs(2), stream.read(&mut byte)).await;
        assert!(matches!(closed, Ok(Ok(0) | Err(_))), "{closed:?}");
        drop(stream);

        // 10,000 connections that send nothing (at most as many as the
        // open-file limit allows).
        let wanted = 10_000usize.min(usize::try_from(hard).unwrap_or(10_000).saturating_sub(200));
        let mut idle = Vec::with_capacity(wanted);
        for _ in 0..wanted {
            match tokio::net::TcpStream::connect(agents).await {
                Ok(stream) => idle.push(stream),
                Err(_) => break,
            }
        }
        assert!(idle.len() >= 1000, "opened {}", idle.len());
        let opened = idle.len();
        tokio::time::sleep(Duration::from_millis(500)).await;
        let during = watch.rss_kib();
        let fds = |watch: &Watch| {
            let pid = watch.child.id().unwrap();
            std::fs::read_dir(format!("/proc/{pid}/fd"))
                .unwrap()
                .count()
        };
        // The orchestrator holds at most `max_connections` (64) of them.
        let held = fds(&watch);
        assert!(held < 64 + 40, "{held} descriptors open while flooded");
        // Past the idle timeout (2 s) it holds none: within 6 s at most.
        let deadline = Instant::now() + Duration::from_secs(6);
        let mut after = fds(&watch);
        while after >= 40 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
            after = fds(&watch);
        }
        assert!(
            after < 40,
            "{after} descriptors open 6 s after the flood (idle timeout 2 s)"
        );
        drop(idle);
        // Over the per-address limit each new one evicts the oldest
        // that never sent a frame.
        assert!(
            watch
                .metric("poolgate_agent_connections_evicted_total")
                .await
                >= 900.0
        );
        assert!(
            during < before + 50 * 1024,
            "RSS {before} KiB → {during} KiB with {opened} idle connections"
        );
    });
}

/// A key file's secret as the test looks for it: the base64 text after
/// the kind's tag, and the key's 32 bytes.
fn key_forms(what: &str, file: &str) -> Vec<(String, Vec<u8>)> {
    use base64::Engine;
    let text = file.trim().rsplit(':').next().unwrap().to_string();
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(&text)
        .unwrap();
    assert_eq!(bytes.len(), 32, "{what} is a 32-byte key");
    vec![
        (format!("{what} (text)"), text.into_bytes()),
        (what.to_string(), bytes),
    ]
}

#[test]
fn keys_and_identity_material_never_appear_in_the_live_logs() {
    let mut plan = plan(2, true);
    plan.node_log = Some("trace".into());
    live(async {
        let mut cluster = LocalCluster::prepare(&plan).await.unwrap();
        let mut watch = Watch::start(&cluster, Some("trace"));
        for i in 0..2 {
            cluster.spawn(i).unwrap();
        }
        let mut lines = BufReader::new(watch.child.stdout.take().unwrap()).lines();
        let stdout = read_until(&mut lines, &["\"pool_ready\""]).await.join("\n");
        watch.child.kill().await.unwrap();
        let stderr = std::fs::read_to_string(cluster.dir.join("watch.log")).unwrap();
        for i in 0..2 {
            cluster.signal(i, Signal::SIGTERM);
            cluster.wait_exit(i, Duration::from_secs(5)).await;
        }
        let mut logs = vec![stdout, stderr];
        for node in &cluster.nodes {
            logs.push(
                std::fs::read_to_string(cluster.dir.join(format!("{}.log", node.name))).unwrap(),
            );
        }
        assert!(
            logs[1].contains("TRACE") || logs[1].contains("DEBUG"),
            "trace logging was on"
        );
        let mut secrets: Vec<(String, Vec<u8>)> = Vec::new();
        for node in &cluster.nodes {
            secrets.push((
                format!("{} identity", node.name),
                std::fs::read(&node.identity).unwrap(),
            ));
            let key =
                std::fs::read_to_string(cluster.dir.join(format!("{}.key", node.name))).unwrap();
            secrets.extend(key_forms(&format!("{} signing key", node.name), &key));
        }
        let cluster_key = std::fs::read_to_string(cluster.dir.join("cluster.key")).unwrap();
        secrets.extend(key_forms("cluster key", &cluster_key));
        use base64::Engine;
        for (what, bytes) in &secrets {
            let forms = [
                base64::engine::general_purpose::STANDARD.encode(bytes),
                hex::encode(bytes),
                String::from_utf8_lossy(bytes).into_owned(),
            ];
            for form in forms.iter().filter(|f| f.len() >= 16) {
                for (i, log) in logs.iter().enumerate() {
                    assert!(!log.contains(form.as_str()), "{what} appears in log {i}");
                }
            }
        }
        let _ = std::io::stderr().flush();
    });
}

#[test]
fn a_frame_captured_before_an_orchestrator_restart_is_refused_after_it() {
    let dir = std::env::temp_dir().join(format!("poolgate-seq-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let key = NodeKey::generate();
    let mut config = one_node_orchestrator(&key);
    config.state.path = Some(dir.join("state.db"));
    let state = n1_state(true);
    let captured = wire::encode(&key, "poolgate", "n1", 5, None, &state);
    live({
        let config = config.clone();
        let key = key.clone();
        let state = state.clone();
        async move {
            let live = Orchestrator::start(&config).await.unwrap();
            let (answer, _) =
                announce_once(live.agents_addr, &key, "poolgate", "n1", 5, &state).await;
            assert_eq!(answer, None, "accepted");
            // The process ends (no stop: as a crash) three of the
            // intervals at which sequences are written after the frame.
            tokio::time::sleep(poolgate::live::orchestrator::SEQUENCES_EVERY * 3).await;
        }
    });
    live(async move {
        let live = Orchestrator::start(&config).await.unwrap();
        // Refused as a replay (a sequence not kept would have it answered
        // with the connection's challenge: refused too, but not for this).
        assert_eq!(
            refusal_code(live.agents_addr, &captured).await.as_deref(),
            Some(wire::REPLAYED),
            "the replay is refused after a restart"
        );
        let (answer, _) = announce_once(live.agents_addr, &key, "poolgate", "n1", 6, &state).await;
        assert_eq!(answer, None, "a newer frame is accepted");
    });
    let _ = std::fs::remove_dir_all(&dir);
}

/// Binds node `i`'s SWIM member to a port chosen here, and returns it.
fn pin_swim_port(cluster: &LocalCluster, i: usize) -> SocketAddr {
    let addr = std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let path = &cluster.nodes[i].config;
    let text = std::fs::read_to_string(path).unwrap();
    let pinned = text.replacen("bind = \"127.0.0.1:0\"", &format!("bind = \"{addr}\""), 1);
    assert_ne!(text, pinned);
    std::fs::write(path, pinned).unwrap();
    addr
}

/// Waits until `member` counts at least `members` others (its gossip is in
/// the cluster): what an attack needs before its effect is judged.
async fn joined(member: &actix::Addr<SwimMember>, members: usize) {
    use poolgate::live::swim::member::MemberCount;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let counted = member.send(MemberCount).await.unwrap();
        if counted >= members {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the member counts {counted} others after 10 s, not {members}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// An insider's SWIM member that claims `node` at `addr` (another node's
/// signed address) from a socket of its own, sealing with the cluster key.
fn forger(
    cluster: &LocalCluster,
    node: &str,
    addr: SocketAddr,
    generation: u64,
) -> actix::Addr<SwimMember> {
    let key = ClusterKey::load(&cluster.dir.join("cluster.key")).unwrap();
    let (forger, _) = SwimMember::start(
        node,
        "127.0.0.1:0".parse().unwrap(),
        Some(&poolgate::live::endpoint::Endpoint::from(addr)),
        generation,
        cluster.config.swim.timings.foca_config(8),
        StdRng::seed_from_u64(2),
        None,
        Keyring::new(&[key], &cluster.config.swim.label),
    )
    .unwrap();
    forger
}

/// Whether `events` stays free of a fault or a readiness loss for `span`.
async fn quiet_for(events: &mut poolgate::EventStream, span: Duration) -> Result<(), Event> {
    let seen = tokio::time::timeout(
        span,
        until(events, |e| match e {
            Event::RunFaulted { .. } | Event::ReadinessLost { .. } => Some(e.clone()),
            _ => None,
        }),
    )
    .await;
    match seen {
        Ok(event) => Err(event),
        Err(_) => Ok(()),
    }
}

#[test]
fn invented_members_at_a_third_partys_address_get_a_bounded_few_datagrams() {
    // Issue 28, reproduction 10: with the cluster key, 20 announcements of
    // invented members at a third party's address made the orchestrator
    // and the nodes send that address 1,224 datagrams in 20 s. What a
    // member sends to an address it has not heard from is bounded.
    use poolgate::live::swim::reflect::{UNHEARD_SENDS, UNHEARD_WINDOW};
    live(async {
        let mut cluster = LocalCluster::prepare(&plan(2, false)).await.unwrap();
        let orchestrator = cluster.orchestrator().unwrap();
        let gate = orchestrator.gate.clone();
        let seed = orchestrator.swim_addr;
        let mut events = gate.subscribe();
        for i in 0..2 {
            cluster.spawn(i).unwrap();
        }
        ready(&mut events).await;
        // The third party: a socket that never answers, counting.
        let victim = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let victim_addr = victim.local_addr().unwrap();
        victim
            .set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let counting = std::thread::spawn(move || {
            let (mut datagrams, mut bytes) = (0usize, 0usize);
            let mut buffer = [0u8; 65_536];
            let end = Instant::now() + UNHEARD_WINDOW * 2;
            while Instant::now() < end {
                if let Ok(n) = victim.recv(&mut buffer) {
                    datagrams += 1;
                    bytes += n;
                }
            }
            (datagrams, bytes)
        });
        let forgers: Vec<_> = (0..20)
            .map(|i| {
                forger(
                    &cluster,
                    &format!("evil-{i}"),
                    victim_addr,
                    boot_generation(),
                )
            })
            .collect();
        // The insider announces them again and again.
        let announcing = {
            let forgers = forgers.clone();
            actix::spawn(async move {
                loop {
                    for forger in &forgers {
                        forger.do_send(Join { seeds: vec![seed] });
                    }
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
            })
        };
        let quiet = quiet_for(&mut events, UNHEARD_WINDOW * 2).await;
        announcing.abort();
        let (datagrams, bytes) = counting.join().unwrap();
        for forger in &forgers {
            forger.do_send(poolgate::live::swim::member::Crash);
        }
        // Three honest members (the orchestrator's and two nodes'), each
        // in the windows that begin within the 20 s counted (two, a
        // third at the edge). Without the bound: about 2,000 datagrams.
        let bound = 3 * 3 * UNHEARD_SENDS as usize;
        eprintln!("the third party received {datagrams} datagrams, {bytes} bytes in 20 s");
        assert!(
            datagrams > 0,
            "the invented members were never probed: the test proves nothing"
        );
        assert!(
            datagrams <= bound,
            "{datagrams} datagrams ({bytes} bytes), over {bound}"
        );
        assert_eq!(quiet, Ok(()), "the honest pool stays ready");
    });
}

#[test]
fn a_forged_identity_at_a_nodes_signed_address_neither_outranks_nor_evicts_it() {
    // Issue 20: "node-1 @ node-1's signed address" at generation + 10^9,
    // from another port, made the gate see node-1 suspect, then dead, and
    // never ready again; any name at node-1's address evicted it too.
    live(async {
        let mut cluster = LocalCluster::prepare(&plan(2, false)).await.unwrap();
        let node1 = pin_swim_port(&cluster, 0);
        let orchestrator = cluster.orchestrator().unwrap();
        let gate = orchestrator.gate.clone();
        let seed = orchestrator.swim_addr;
        let mut events = gate.subscribe();
        for i in 0..2 {
            cluster.spawn(i).unwrap();
        }
        let epoch = ready(&mut events).await;
        let run = RunId::new("r").unwrap();
        gate.begin_planning(run.clone(), Some(epoch)).await.unwrap();
        gate.commit_plan(run.clone(), vec![node("node-1")], Some(epoch))
            .await
            .unwrap();
        let outrank = forger(&cluster, "node-1", node1, boot_generation() + 1_000_000_000);
        let evict = forger(&cluster, "node-2", node1, boot_generation() + 1_000_000_000);
        outrank.do_send(Join { seeds: vec![seed] });
        evict.do_send(Join { seeds: vec![seed] });
        assert_eq!(quiet_for(&mut events, Duration::from_secs(3)).await, Ok(()));
        // The forgers stop: their identities are suspected, then declared
        // down; none of it is node-1's.
        outrank.do_send(poolgate::live::swim::member::Crash);
        evict.do_send(poolgate::live::swim::member::Crash);
        assert_eq!(quiet_for(&mut events, Duration::from_secs(4)).await, Ok(()));
        // node-1's own end still faults the run.
        cluster.kill(0);
        let faulted = until(&mut events, |e| match e {
            Event::RunFaulted { node, .. } => Some(node.clone()),
            _ => None,
        })
        .await;
        assert_eq!(faulted, node("node-1"));
    });
}

#[test]
fn a_forger_keeping_a_sigkilled_node_alive_in_swim_does_not_keep_the_run() {
    // Issue 20: forged datagrams naming node-1 kept a SIGKILLed node-1
    // "alive" in SWIM and the run committed after 25 s.
    live(async {
        let mut cluster = LocalCluster::prepare(&plan(2, false)).await.unwrap();
        let node1 = pin_swim_port(&cluster, 0);
        let orchestrator = cluster.orchestrator().unwrap();
        let gate = orchestrator.gate.clone();
        let seed = orchestrator.swim_addr;
        let mut events = gate.subscribe();
        for i in 0..2 {
            cluster.spawn(i).unwrap();
        }
        let epoch = ready(&mut events).await;
        let run = RunId::new("r").unwrap();
        gate.begin_planning(run.clone(), Some(epoch)).await.unwrap();
        gate.commit_plan(run.clone(), vec![node("node-1")], Some(epoch))
            .await
            .unwrap();
        // The same name at the same address, one generation up: the
        // closest a forger can come to node-1's own identity.
        let forged = forger(&cluster, "node-1", node1, boot_generation() + 1);
        forged.do_send(Join { seeds: vec![seed] });
        // The forger advertises node-1's address, so nothing it is sent
        // comes back to it: there is no answer to wait for. Its announce
        // and first gossip go out at once; half a second lets them land.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let killed = Instant::now();
        cluster.kill(0);
        let faulted = until(&mut events, |e| match e {
            Event::RunFaulted { node, reason, .. } => Some((node.clone(), *reason)),
            _ => None,
        })
        .await;
        assert_eq!(faulted.0, node("node-1"));
        // Within the lost connection's grace (the heartbeats' deadline
        // bounds a connection that goes silent instead).
        assert!(
            killed.elapsed() < Duration::from_secs(3),
            "{:?}",
            killed.elapsed()
        );
    });
}

#[test]
fn a_second_live_process_signing_as_one_node_is_reported_naming_both_addresses() {
    // Issue 20: two processes with one node's config and key (a copied
    // config, a stolen key) were not told apart from one.
    live(async {
        let mut cluster = LocalCluster::prepare(&plan(1, true)).await.unwrap();
        let watch = Watch::start(&cluster, None);
        cluster.spawn(0).unwrap();
        watch.until_metric("poolgate_agent_frames_total", 1.0).await;
        let mut twin = copy_of_node(&cluster, Stdio::null());
        watch
            .until_metric("poolgate_agent_duplicate_signers_total", 1.0)
            .await;
        twin.kill().await.unwrap();
        let said = std::fs::read_to_string(cluster.dir.join("watch.log")).unwrap();
        let line = said
            .lines()
            .find(|l| l.contains("two live processes sign as this node"))
            .unwrap_or_else(|| panic!("{said}"));
        assert!(
            line.contains("node-1") && line.matches("127.0.0.1:").count() >= 2,
            "{line}"
        );
    });
}

#[test]
fn the_node_a_copy_signed_ahead_of_is_ready_again_once_the_copy_stops() {
    // An operator's trial: a copy of a node's config and key started
    // beside it signs in a later life of sequences; the real node's frames
    // were refused as replays from then on, and still after the copy
    // stopped, until its agent was restarted by hand. A first mend (each
    // refused agent starting a new life) had the two swap ten times a
    // second while both ran, and the copy's leave, at a newer SWIM
    // generation, kept the node `left` once it was gone.
    live(async {
        let (cluster, watch, mut events) = ready_under_watch(&plan(1, true)).await;
        let real = cluster.pid(0);
        let log = std::fs::File::create(cluster.dir.join("copy.log")).unwrap();
        let mut copy = copy_of_node(&cluster, log.into());
        // The copy, holding the node's key, stands in for it (reported),
        // and holds it: the real node, behind it, is refused and waits
        // (four tries: over a second).
        until_line(&mut events, &["\"readiness_lost\""]).await;
        until_line(&mut events, &["\"pool_ready\""]).await;
        watch
            .until_metric("poolgate_agent_duplicate_signers_total", 1.0)
            .await;
        watch
            .until_metric(
                "poolgate_agent_frames_refused_total{reason=\"replayed\"",
                4.0,
            )
            .await;
        // The copy stopped as an operator stops it: it leaves, and the
        // node is ready again on its own.
        let pid = nix::unistd::Pid::from_raw(i32::try_from(copy.id().unwrap()).unwrap());
        nix::sys::signal::kill(pid, Signal::SIGTERM).unwrap();
        copy.wait().await.unwrap();
        until_line(&mut events, &["\"readiness_lost\""]).await;
        until_line(&mut events, &["\"pool_ready\""]).await;
        assert_eq!(cluster.pid(0), real, "the real node was not restarted");
        // Told apart once, not taking turns while both ran.
        let twins = watch.metric("poolgate_agent_duplicate_signers_total").await;
        assert!(twins < 3.0, "{twins} second signers reported");
    });
}

#[test]
fn a_node_stopped_and_started_again_at_once_is_not_taken_for_a_second_signer() {
    // An operator's trial: every quick restart of a node agent (SIGTERM
    // or SIGKILL, started again within a second) raised "two live
    // processes sign as this node": the ended connection was still
    // attached (the lost connection's grace, or for good after the
    // node's `leaving`).
    live(async {
        let mut cluster = LocalCluster::prepare(&plan(1, true)).await.unwrap();
        let watch = Watch::start(&cluster, None);
        cluster.spawn(0).unwrap();
        watch.until_metric("poolgate_agent_frames_total", 1.0).await;
        for signal in [Signal::SIGTERM, Signal::SIGKILL] {
            let frames = watch.metric("poolgate_agent_frames_total").await;
            cluster.signal(0, signal);
            let _ = cluster.wait_exit(0, Duration::from_secs(10)).await;
            cluster.spawn(0).unwrap();
            // The new process's first frames are in.
            watch
                .until_metric("poolgate_agent_frames_total", frames + 2.0)
                .await;
        }
        assert_eq!(
            watch.metric("poolgate_agent_duplicate_signers_total").await,
            0.0
        );
    });
}

#[test]
fn a_hundred_thousand_invented_members_at_one_address_leave_the_orchestrators_memory_flat() {
    // Issue 20: 100,000 invented names at 2,000/s raised the orchestrator
    // from 6.6 to 47.7 MB, for good (tables per address that never
    // shrink, every name at one address scanned on each report).
    use foca::{Codec, Header, Message};
    use poolgate::live::swim::identity::SwimIdentity;
    live(async {
        let (cluster, watch, lines) = ready_under_watch(&plan(1, true)).await;
        let target = cluster.config.swim.bind;
        let key = ClusterKey::load(&cluster.dir.join("cluster.key")).unwrap();
        let keyring = Keyring::new(&[key], &cluster.config.swim.label);
        let flooder = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let from = flooder.local_addr().unwrap();
        let datagram = |i: u64| {
            let header = Header {
                src: SwimIdentity::new(format!("made-up-{i}"), from, i + 1),
                src_incarnation: 0,
                dst: SwimIdentity::seed(target),
                message: Message::Announce,
            };
            let mut plain = Vec::new();
            foca::PostcardCodec
                .encode_header(&header, &mut plain)
                .unwrap();
            keyring.seal(&plain)
        };
        let send = |range: std::ops::Range<u64>| {
            for i in range {
                let _ = flooder.send_to(&datagram(i), target);
                if i % 100 == 0 {
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        };
        // Warm up, then measure over the 100,000.
        send(0..10_000);
        let before = watch.rss_kib();
        send(10_000..110_000);
        tokio::time::sleep(Duration::from_secs(1)).await;
        let after = watch.rss_kib();
        assert!(
            after < before + 4 * 1024,
            "RSS {before} KiB → {after} KiB after 100,000 invented members"
        );
        // (Whether the real node stays ready meanwhile is not asserted: at
        // this pace a debug build's orchestrator can fall behind its
        // heartbeats on a loaded machine and make it unavailable for a
        // moment, a fail-safe fault; the claim here is the memory.)
        drop(lines);
    });
}

/// What the orchestrator answers one frame: `None` when accepted.
async fn answer_to(agents: SocketAddr, frame: &[u8]) -> Option<String> {
    let mut stream = tokio::net::TcpStream::connect(agents).await.unwrap();
    stream.write_all(frame).await.unwrap();
    let reply = tokio::time::timeout(Duration::from_secs(2), wire::read_reply(&mut stream)).await;
    match reply {
        Ok(Ok(Some(wire::Reply::Accepted { .. }))) => None,
        other => Some(format!("{other:?}")),
    }
}

/// The code of the refusal `frame` is answered with on a new connection
/// (`None`: it was not refused; answered with a challenge, say).
async fn refusal_code(agents: SocketAddr, frame: &[u8]) -> Option<String> {
    let mut stream = tokio::net::TcpStream::connect(agents).await.unwrap();
    stream.write_all(frame).await.unwrap();
    let reply = tokio::time::timeout(Duration::from_secs(2), wire::read_reply(&mut stream)).await;
    match reply {
        Ok(Ok(Some(wire::Reply::Refused { code, .. }))) => Some(code),
        _ => None,
    }
}

fn announcing(name: &str) -> Announcement {
    Announcement {
        available: true,
        identity: Some(wire::identity_text(name.as_bytes())),
        swim: None,
        generation: None,
        fault: None,
        leaving: false,
        heartbeat_ms: None,
        ask: None,
    }
}

#[test]
fn a_stolen_keys_last_sequence_does_not_lock_out_the_key_registered_in_its_place() {
    // Adversary finding: a thief with n1's old key sends sequence 2^64 − 1;
    // the operator registers a new key at runtime. The new key's frames
    // were refused as replayed, and after a restart too (the sequence was
    // stored under the new key's id). A key replaced starts its sequences
    // over, in this life and the next.
    let dir = std::env::temp_dir().join(format!("poolgate-stolen-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (stolen, fresh) = (NodeKey::generate(), NodeKey::generate());
    let mut config = Config::parse(
        "[pool]\nid = \"p\"\nmembers = [\"n1\"]\n[readiness]\nconvergence_window = \"50ms\"\n\
         [swim]\ninsecure = true\nbind = \"127.0.0.1:0\"\n[agents]\nlisten = \"127.0.0.1:0\"\n",
        "test",
    )
    .unwrap();
    config.registry.insert(node("n1"), stolen.public());
    config.state.path = Some(dir.join("state.db"));
    let first = config.clone();
    let (thief, new) = (stolen.clone(), fresh.clone());
    live_for(Duration::from_secs(30), async move {
        let live = Orchestrator::start(&first).await.unwrap();
        let label = first.swim.label.clone();
        let agents = live.agents_addr;
        let (answer, _) =
            announce_once(agents, &thief, &label, "n1", u64::MAX, &announcing("n1")).await;
        assert_eq!(answer, None, "the thief's frame");
        live.register(node("n1"), new.public()).await.unwrap();
        let (answer, _) = announce_once(agents, &new, &label, "n1", 1000, &announcing("n1")).await;
        assert_eq!(answer, None, "the new key's first frame refused");
        // The old key's frames are refused from now on.
        let again = wire::encode(&thief, &label, "n1", 5, None, &announcing("n1"));
        assert!(answer_to(live.agents_addr, &again).await.is_some());
        // Stopped at once: a stop writes the last sequences.
        live.stop().await;
    });
    // Restarted with the new key pinned: its next frame counts.
    config.registry.insert(node("n1"), fresh.public());
    live_for(Duration::from_secs(30), async move {
        let live = Orchestrator::start(&config).await.unwrap();
        let label = config.swim.label.clone();
        let replayed = wire::encode(&fresh, &label, "n1", 1000, None, &announcing("n1"));
        assert_eq!(
            refusal_code(live.agents_addr, &replayed).await.as_deref(),
            Some(wire::REPLAYED),
            "the new key's own sequences hold across the restart"
        );
        let (answer, _) = announce_once(
            live.agents_addr,
            &fresh,
            &label,
            "n1",
            1001,
            &announcing("n1"),
        )
        .await;
        assert_eq!(answer, None, "after the restart");
        live.stop().await;
    });
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_swim_member_detached_by_a_stale_term_keeps_feeding_the_current_one() {
    // Adversary finding: a term's orchestrator stopped after the next term
    // attached to the same warm member detached the next term's gate (no
    // more SWIM facts). A detach now names its attachment.
    use poolgate::live::swim::member::{Attach, Detach};
    use std::sync::{Arc, Mutex};
    live_for(Duration::from_secs(30), async {
        let config = Config::parse(BASE, "test").unwrap();
        let timings = config.swim.timings.foca_config(4);
        let keyring = || Keyring::new(&[], "poolgate");
        let start = |name: &str, seed: u64| {
            SwimMember::start(
                name,
                "127.0.0.1:0".parse().unwrap(),
                None,
                boot_generation(),
                timings.clone(),
                StdRng::seed_from_u64(seed),
                None,
                keyring(),
            )
            .unwrap()
        };
        let (warm, warm_addr) = start("orchestrator", 1);
        let heard: [Arc<Mutex<Vec<String>>>; 2] = Default::default();
        for (token, seen) in heard.iter().enumerate() {
            let seen = Arc::clone(seen);
            warm.send(Attach {
                token: token as u64 + 1,
                sink: Box::new(move |o| {
                    seen.lock().unwrap().push(o.update.node.to_string());
                    true
                }),
                signed: Default::default(),
                term_lasts: std::sync::Arc::new(|| true),
                only: ["node-1".to_string()].into_iter().collect(),
                vouching: Default::default(),
            })
            .await
            .unwrap();
        }
        // The first term stops late: its detach leaves the second attached.
        warm.send(Detach(1)).await.unwrap();
        let (node1, _) = start("node-1", 2);
        node1.do_send(Join {
            seeds: vec![warm_addr],
        });
        let deadline = Instant::now() + Duration::from_secs(10);
        while heard[1].lock().unwrap().is_empty() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(
            heard[1].lock().unwrap().first().map(String::as_str),
            Some("node-1")
        );
        assert!(
            heard[0].lock().unwrap().is_empty(),
            "the replaced attachment heard it"
        );
        warm.send(Detach(2)).await.unwrap();
        node1.do_send(poolgate::live::swim::member::Crash);
        warm.do_send(poolgate::live::swim::member::Crash);
    });
}

/// An operator's finding: a leader frozen past its lease, a node
/// restarted meanwhile (a new generation at the same address) under the
/// next leader, and the old leader continued: its warm member read the
/// datagrams that waited with its term's signed identities still in
/// force, so the node's last life won the address conflict, the new one
/// was declared down and rejoined, and the next leader saw readiness lost
/// (once, a run over the node faulted `dead`). A member decides conflicts
/// by a term's signed identities only while the term lasts by its own
/// clock. The control (the term lasting) shows the mechanism: there the
/// node's last life keeps its place, and the new one, not signed yet,
/// is not told it is down either (each such notice made a node renew
/// again, a storm, until its frame signed the renewal: design §15).
#[test]
fn a_deposed_leaders_member_does_not_decide_conflicts_by_its_terms_signatures() {
    use poolgate::live::swim::identity::SignedView;
    use poolgate::live::swim::member::{Attach, Crash, MemberCount, WatchGeneration};
    use std::sync::Arc;
    for term_over in [true, false] {
        live_for(Duration::from_secs(40), async move {
            let config = Config::parse(BASE, "test").unwrap();
            let timings = config.swim.timings.foca_config(4);
            let start = |name: &str, bind: SocketAddr, generation: u64, seed: u64| {
                SwimMember::start(
                    name,
                    bind,
                    None,
                    generation,
                    timings.clone(),
                    StdRng::seed_from_u64(seed),
                    None,
                    Keyring::new(&[], "poolgate"),
                )
            };
            let (warm, warm_addr) = start(
                "orchestrator",
                "127.0.0.1:0".parse().unwrap(),
                boot_generation(),
                1,
            )
            .unwrap();
            let (first, node_addr) =
                start("node-1", "127.0.0.1:0".parse().unwrap(), 10, 2).unwrap();
            first.do_send(Join {
                seeds: vec![warm_addr],
            });
            let deadline = Instant::now() + Duration::from_secs(10);
            while warm.send(MemberCount).await.unwrap() < 1 && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let signed: SignedView = Default::default();
            signed
                .write()
                .unwrap()
                .insert(node_addr, ("node-1".to_string(), 10));
            let lasts = !term_over;
            // The generations of node-1 the member tells of.
            let told = Arc::new(std::sync::Mutex::new(Vec::new()));
            let telling = Arc::clone(&told);
            warm.send(Attach {
                token: 1,
                sink: Box::new(move |fact| {
                    telling.lock().unwrap().push(fact.update.incarnation >> 16);
                    true
                }),
                signed,
                term_lasts: Arc::new(move || lasts),
                only: ["node-1".to_string()].into_iter().collect(),
                vouching: Default::default(),
            })
            .await
            .unwrap();
            // node-1 restarts at the same address, its next generation.
            first.send(Crash).await.unwrap();
            let deadline = Instant::now() + Duration::from_secs(2);
            let second = loop {
                match start("node-1", node_addr, 11, 3) {
                    Ok((second, _)) => break second,
                    Err(e) if Instant::now() < deadline => {
                        let _ = e;
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    Err(e) => panic!("{e}"),
                }
            };
            let (own, mut renewed) = tokio::sync::watch::channel(11);
            second.do_send(WatchGeneration(own));
            second.do_send(Join {
                seeds: vec![warm_addr],
            });
            // Declared down, it rejoins under its next generation.
            let declared_down = tokio::time::timeout(Duration::from_secs(5), async {
                while *renewed.borrow_and_update() == 11 {
                    if renewed.changed().await.is_err() {
                        std::future::pending::<()>().await;
                    }
                }
            })
            .await
            .is_ok();
            second.do_send(Crash);
            warm.do_send(Crash);
            assert!(
                !declared_down,
                "the restarted node was told it is down (term over: {term_over})"
            );
            let heard_new = told.lock().unwrap().contains(&11);
            assert_eq!(
                heard_new, term_over,
                "the new life heard of (control: a lasting term's signatures decide the conflict)"
            );
        });
    }
}

#[test]
fn a_frame_sent_before_the_challenge_was_read_is_skipped_not_refused() {
    // CI finding (tests/hosts.rs, a node restarted with its clock behind):
    // a node whose state changed right after it connected sent a second
    // frame before it read the challenge; signed without it, that frame
    // was refused as badly signed and the connection closed. Such a
    // frame is skipped (never applied) until the first one over the challenge.
    let key = NodeKey::generate();
    let config = one_node_orchestrator(&key);
    let state = n1_state(true);
    live(async move {
        let live = Orchestrator::start(&config).await.unwrap();
        let mut stream = tokio::net::TcpStream::connect(live.agents_addr)
            .await
            .unwrap();
        for seq in [1, 2] {
            let frame = wire::encode(&key, "poolgate", "n1", seq, None, &state);
            stream.write_all(&frame).await.unwrap();
        }
        let reply =
            tokio::time::timeout(Duration::from_secs(2), wire::read_reply(&mut stream)).await;
        let nonce = match reply {
            Ok(Ok(Some(wire::Reply::Challenge { nonce }))) => {
                wire::challenge_nonce(&nonce).unwrap()
            }
            other => panic!("{other:?}"),
        };
        let bound = wire::encode(&key, "poolgate", "n1", 3, Some(&nonce), &state);
        stream.write_all(&bound).await.unwrap();
        let reply =
            tokio::time::timeout(Duration::from_secs(2), wire::read_reply(&mut stream)).await;
        assert!(
            matches!(reply, Ok(Ok(Some(wire::Reply::Accepted { .. })))),
            "{reply:?}"
        );
        // Skipped a few times, not for ever: a stream of frames without
        // the challenge is no node at work, and is refused.
        let mut stream = tokio::net::TcpStream::connect(live.agents_addr)
            .await
            .unwrap();
        for seq in 10..20 {
            let frame = wire::encode(&key, "poolgate", "n1", seq, None, &state);
            stream.write_all(&frame).await.unwrap();
        }
        let challenge =
            tokio::time::timeout(Duration::from_secs(2), wire::read_reply(&mut stream)).await;
        assert!(
            matches!(challenge, Ok(Ok(Some(wire::Reply::Challenge { .. })))),
            "{challenge:?}"
        );
        let reply =
            tokio::time::timeout(Duration::from_secs(2), wire::read_reply(&mut stream)).await;
        assert!(
            matches!(reply, Ok(Ok(Some(wire::Reply::Refused { .. })))),
            "{reply:?}"
        );
        live.shutdown();
    });
}
