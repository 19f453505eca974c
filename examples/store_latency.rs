//! `commit_plan` latency over each state store, in one run: memory (no
//! store), the redb file, and etcd (a one-member and a three-member
//! cluster this example starts on 127.0.0.1; `etcd` must be installed). Each round plans,
//! commits and finishes one run on a ready pool; the commit is durable
//! before it returns.
//!
//! ```text
//! cargo run --release --example store_latency -- --json [--rounds 200]
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use poolgate::core::{
    AgentReport, Durable, MembershipUpdate, NodeId, RegistryFact, RunId, SwimState,
};
use poolgate::state::etcd::{EtcdStore, Fence, Term};
use poolgate::{DurableSettings, Gate, GateSettings, StateStore};

fn settings(store: Option<Arc<dyn StateStore>>) -> GateSettings {
    let config = poolgate::Config::parse(
        "[pool]\nid = \"pool-a\"\nmembers = [\"node-1\"]\n[readiness]\nconvergence_window = \"1ms\"\n",
        "inline",
    )
    .expect("config");
    let settings = config.gate_settings().expect("settings");
    match store {
        Some(store) => settings
            .with_durable(DurableSettings {
                store,
                restored: Durable::default(),
                restore_grace: Duration::from_secs(30),
            })
            .expect("settings"),
        None => settings,
    }
}

async fn measure(store: Option<Arc<dyn StateStore>>, rounds: usize) -> Vec<Duration> {
    let gate = Gate::try_start(settings(store)).expect("gate");
    let node = NodeId::new("node-1").expect("id");
    gate.registry(RegistryFact::Known { node: node.clone() })
        .await
        .expect("registry");
    gate.membership(MembershipUpdate {
        node: node.clone(),
        state: SwimState::Alive,
        incarnation: 1,
    })
    .await
    .expect("alive");
    gate.agent(AgentReport::Available { node: node.clone() })
        .await
        .expect("available");
    gate.identity(node.clone(), b"key".to_vec())
        .await
        .expect("identity");
    let mut took = Vec::with_capacity(rounds);
    for i in 0..rounds {
        let ready = gate.wait_ready().await.expect("ready");
        let run = RunId::new(&format!("run-{i}")).expect("id");
        gate.begin_planning(run.clone(), Some(ready.epoch))
            .await
            .expect("plan");
        let began = Instant::now();
        gate.commit_plan(run.clone(), vec![node.clone()], Some(ready.epoch))
            .await
            .expect("commit");
        took.push(began.elapsed());
        gate.finish_run(run).await.expect("finish");
    }
    gate.stop();
    took
}

fn summary(name: &str, mut took: Vec<Duration>) -> serde_json::Value {
    took.sort();
    let at = |q: f64| took[((took.len() - 1) as f64 * q) as usize].as_secs_f64() * 1e3;
    serde_json::json!({ "store": name, "rounds": took.len(), "p50_ms": at(0.5), "p99_ms": at(0.99), "max_ms": at(1.0) })
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("port")
}

/// Starts an etcd cluster of `n` members on 127.0.0.1 under `dir`: its
/// processes and client endpoints.
fn start_etcd(dir: &std::path::Path, n: usize) -> (Vec<std::process::Child>, Vec<String>) {
    let urls: Vec<(String, String)> = (0..n)
        .map(|_| {
            (
                format!("http://127.0.0.1:{}", free_port()),
                format!("http://127.0.0.1:{}", free_port()),
            )
        })
        .collect();
    let initial = urls
        .iter()
        .enumerate()
        .map(|(i, (_, peer))| format!("e{i}={peer}"))
        .collect::<Vec<_>>()
        .join(",");
    let children = urls
        .iter()
        .enumerate()
        .map(|(i, (client, peer))| {
            std::process::Command::new("etcd")
                .args(["--name", &format!("e{i}"), "--data-dir"])
                .arg(dir.join(format!("e{i}")))
                .args([
                    "--listen-client-urls",
                    client,
                    "--advertise-client-urls",
                    client,
                ])
                .args([
                    "--listen-peer-urls",
                    peer,
                    "--initial-advertise-peer-urls",
                    peer,
                ])
                .args(["--initial-cluster", &initial])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .expect("etcd (Debian: etcd-server) starts")
        })
        .collect();
    (
        children,
        urls.into_iter().map(|(client, _)| client).collect(),
    )
}

/// A store on the etcd at `endpoints`, fenced by a leader key this
/// process makes (it leads for the whole run).
fn etcd_store(endpoints: &[String]) -> Arc<dyn StateStore> {
    let api =
        Arc::new(poolgate::etcd::Etcd::new(endpoints, Duration::from_secs(2)).expect("endpoint"));
    let deadline = Instant::now() + Duration::from_secs(30);
    while api.get(b"probe").is_err() {
        assert!(Instant::now() < deadline, "etcd did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    let prefix = "/poolgate/bench/pool-a/";
    api.put(format!("{prefix}leader").as_bytes(), b"{}")
        .expect("leader key");
    let created = api
        .get(format!("{prefix}leader").as_bytes())
        .expect("read")
        .expect("key")
        .create_revision;
    let fence = Arc::new(Fence::default());
    fence.set(Term {
        created,
        until: Instant::now() + Duration::from_secs(3600),
    });
    EtcdStore::new(api, prefix, "bench", "pool-a", fence)
        .bind(created)
        .expect("the prefix reads")
        .0
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let json = args.iter().any(|a| a == "--json");
    let rounds = args
        .iter()
        .position(|a| a == "--rounds")
        .and_then(|i| args.get(i + 1))
        .and_then(|r| r.parse().ok())
        .unwrap_or(200);
    let dir = std::env::temp_dir().join(format!("poolgate-store-latency-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch");
    let (mut one, one_endpoints) = start_etcd(&dir.join("one"), 1);
    let (mut three, three_endpoints) = start_etcd(&dir.join("three"), 3);
    let one_store = etcd_store(&one_endpoints);
    let three_store = etcd_store(&three_endpoints);
    let (redb_store, _) = poolgate::state::RedbStore::open(&dir.join("state.db")).expect("redb");
    let redb_store: Arc<dyn StateStore> = redb_store;

    let results = actix::System::new().block_on(async move {
        vec![
            summary("memory", measure(None, rounds).await),
            summary("redb", measure(Some(redb_store), rounds).await),
            summary(
                "etcd (1 member, loopback)",
                measure(Some(one_store), rounds).await,
            ),
            summary(
                "etcd (3 members, loopback)",
                measure(Some(three_store), rounds).await,
            ),
        ]
    });
    for child in one.iter_mut().chain(three.iter_mut()) {
        let _ = child.kill();
        let _ = child.wait();
    }
    let _ = std::fs::remove_dir_all(&dir);
    for r in &results {
        if json {
            println!("{r}");
        } else {
            println!(
                "{:<28} p50 {:>8.3} ms  p99 {:>8.3} ms  max {:>8.3} ms",
                r["store"].as_str().unwrap_or("?"),
                r["p50_ms"],
                r["p99_ms"],
                r["max_ms"]
            );
        }
    }
}
