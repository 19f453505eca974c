//! `commit_plan` latency over each state store, in one run: memory (no
//! store), the redb file, and etcd (a one-member cluster over plain http
//! and over TLS with a client certificate, and a three-member cluster,
//! all started by this example on 127.0.0.1 as the tests start them,
//! `tests/common/etcd.rs`; `etcd` and `openssl` must be installed). Each round plans, commits and finishes one run on a ready
//! pool; the commit is durable before it returns.
//!
//! Then the etcd requests per second of a quiet leader (a replica leading
//! a pool with nothing happening, for `--quiet` seconds), counted by etcd
//! itself (`grpc_server_started_total` on its `/metrics`): the leader as
//! built (it watches the run requests, and looks once a second besides)
//! against the look it made before the watch (four ranges every 100 ms),
//! replayed with the same client.
//!
//! ```text
//! cargo run --release --example store_latency -- --json [--rounds 200] [--quiet 10]
//! ```

// The etcd servers and test certificates the tests use: one way to start
// them.
#[path = "../tests/common/etcd.rs"]
#[macro_use]
mod etcd;

use std::sync::Arc;
use std::time::{Duration, Instant};

use poolgate::core::{
    AgentReport, Durable, MembershipUpdate, NodeId, RegistryFact, RunId, SwimState,
};
use poolgate::state::etcd::{EtcdStore, Fence, LeaderTerm};
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

/// A store on the etcd at `endpoints`, fenced by a leader key this
/// process makes (it leads for the whole run).
fn etcd_store(endpoints: &[String], tls: &poolgate::ha::etcd::TlsFiles) -> Arc<dyn StateStore> {
    let api = Arc::new(
        poolgate::ha::etcd::Etcd::new(endpoints, Duration::from_secs(2))
            .and_then(|etcd| etcd.with_tls(tls))
            .expect("endpoint"),
    );
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
    fence.set(LeaderTerm {
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
    let quiet = args
        .iter()
        .position(|a| a == "--quiet")
        .and_then(|i| args.get(i + 1))
        .and_then(|r| r.parse().ok())
        .unwrap_or(10u64);
    let certs = etcd::Certs::make("bench");
    let tls = certs.client();
    let plain = poolgate::ha::etcd::TlsFiles::default();
    let one = etcd::Etcd::start("bench-one");
    let secure = etcd::Etcd::start_tls("bench-tls", &certs);
    let three = etcd::Cluster::start("bench-three", 3);
    let one_store = etcd_store(std::slice::from_ref(&one.endpoint), &plain);
    let tls_store = etcd_store(std::slice::from_ref(&secure.endpoint), &tls);
    let three_store = etcd_store(&three.endpoints(), &plain);
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
                "etcd (1 member, loopback, TLS + client cert)",
                measure(Some(tls_store), rounds).await,
            ),
            summary(
                "etcd (3 members, loopback)",
                measure(Some(three_store), rounds).await,
            ),
        ]
    });
    let load = quiet_leader(&one.endpoint, Duration::from_secs(quiet));
    drop((one, secure, three, certs));
    let _ = std::fs::remove_dir_all(&dir);
    for r in &load {
        if json {
            println!("{r}");
        } else {
            println!(
                "quiet leader, {:<40} {:>7.1} etcd requests/s",
                r["leader"].as_str().unwrap_or("?"),
                r["requests_per_s"].as_f64().unwrap_or(0.0)
            );
        }
    }
    for r in &results {
        if json {
            println!("{r}");
        } else {
            println!(
                "{:<46} p50 {:>8.3} ms  p99 {:>8.3} ms  max {:>8.3} ms",
                r["store"].as_str().unwrap_or("?"),
                r["p50_ms"],
                r["p99_ms"],
                r["max_ms"]
            );
        }
    }
}

/// etcd's count of the requests it started (every RPC, the gateway's
/// included), read from its `/metrics`.
fn requests_started(endpoint: &str) -> f64 {
    let text = ureq::get(format!("{endpoint}/metrics"))
        .call()
        .expect("etcd's metrics")
        .body_mut()
        .read_to_string()
        .expect("etcd's metrics");
    text.lines()
        .filter(|l| l.starts_with("grpc_server_started_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The requests per second etcd at `endpoint` serves over `span` to a
/// quiet leader: a replica leading a pool with nothing happening, as
/// built; then the look the leader made before it watched (the four
/// request ranges every 100 ms, and its lease renewed every second),
/// replayed with the same client.
fn quiet_leader(endpoint: &str, span: Duration) -> Vec<serde_json::Value> {
    let config = poolgate::Config::parse(
        &format!(
            "[pool]\nid = \"pool-q\"\nmembers = [\"node-1\"]\n[readiness]\nconvergence_window = \"1s\"\n\
             [swim]\nbind = \"127.0.0.1:0\"\ninsecure = true\nlabel = \"quiet\"\n\
             [agents]\nlisten = \"127.0.0.1:0\"\n\
             [state]\netcd = [\"{endpoint}\"]\ninsecure = true\n"
        ),
        "inline",
    )
    .expect("config");
    let per_s = |before: f64, after: f64| (after - before) / span.as_secs_f64();
    let watching = actix::System::new().block_on(async {
        let mut replica = poolgate::ha::replica::Replica::start(&config).expect("replica");
        let live = replica.lead(None).await.expect("leads");
        // Settled: its term begun, its first looks made.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let before = requests_started(endpoint);
        tokio::time::sleep(span).await;
        let after = requests_started(endpoint);
        live.stop().await;
        replica.resign();
        per_s(before, after)
    });
    let etcd = poolgate::ha::etcd::Etcd::new(&[endpoint.to_string()], Duration::from_secs(2))
        .expect("endpoint");
    let (lease, _) = etcd.grant(Duration::from_secs(6)).expect("lease");
    let before = requests_started(endpoint);
    let started = Instant::now();
    let mut renewed = Instant::now();
    while started.elapsed() < span {
        for dir in ["finish/", "requests/", "alive/", "requested/"] {
            etcd.get_prefix(format!("/poolgate/quiet/pool-q/{dir}").as_bytes())
                .expect("range");
        }
        if renewed.elapsed() >= Duration::from_secs(1) {
            etcd.keep_alive(lease).expect("renewed");
            renewed = Instant::now();
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let polling = per_s(before, requests_started(endpoint));
    let _ = etcd.revoke(lease);
    vec![
        serde_json::json!({ "metric": "quiet_leader_etcd_requests_per_s", "leader": "as built (watch + 1 look/s)", "requests_per_s": watching }),
        serde_json::json!({ "metric": "quiet_leader_etcd_requests_per_s", "leader": "before the watch (4 ranges / 100 ms)", "requests_per_s": polling }),
    ]
}
