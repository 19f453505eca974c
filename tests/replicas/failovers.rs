//! A hundred forced failovers among three replicas on a real etcd (design
//! §12, issue 22), in random order: a clean stop (the lease revoked), a
//! crash (the lease left to expire) and restart, and isolation from etcd
//! (every connection to it refused until healed). A run committed in the
//! first term is guarded in every term after. Checked from what each term
//! did: terms never overlap (a leader stops acting before the next one
//! starts), every epoch is issued once and above every earlier one, the run
//! is restored and never faulted by a takeover, and the gap between terms
//! stays within the lease plus a second. One etcd on 127.0.0.1; each
//! replica reaches it through a proxy of its own that the test can cut.

use std::sync::Arc;
use std::time::{Duration, Instant};

use poolgate::core::{Event, NodeId, RunId};
use poolgate::ha::replica::Replica;
use poolgate::Config;
use rand::{RngExt, SeedableRng};

use crate::common::live::live_for;
use crate::common::make_ready;
use crate::{common, etcd, one_at_a_time};

fn config(endpoint: &str) -> Config {
    etcd::replica_config(
        &[endpoint.to_string()],
        "failovers",
        "20ms",
        "2s",
        "restore_grace = \"10s\"\n",
    )
}

/// What one term did.
struct TermSeen {
    replica: usize,
    /// When its campaign won (from then on it may act).
    won: Instant,
    /// When its orchestrator ran (the run guarded again from here).
    started: Instant,
    /// When it stopped acting (its orchestrator shut down).
    ended: Instant,
    epochs: Vec<u64>,
    faulted: bool,
}

#[derive(Clone, Copy, Debug)]
enum Force {
    Stop,
    Crash,
    Isolate,
}

const FAILOVERS: usize = 100;

#[test]
fn a_hundred_forced_failovers_keep_one_leader_distinct_epochs_and_the_run_guarded() {
    need_etcd!();
    let _one_at_a_time = one_at_a_time();
    let server = etcd::Etcd::start("failovers");
    let etcd_port: u16 = server
        .endpoint
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("port");
    let proxies: Vec<etcd::Proxy> = (0..3).map(|_| etcd::Proxy::start(etcd_port)).collect();
    let configs: Vec<Config> = proxies.iter().map(|p| config(&p.endpoint())).collect();
    let seed = std::env::var("POOLGATE_FAILOVER_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(22);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut terms: Vec<TermSeen> = Vec::new();
    let mut forces = Vec::new();
    let run = RunId::new("run-guarded").unwrap();
    let node = NodeId::new("node-1").unwrap();

    live_for(Duration::from_secs(900), async {
        let mut replicas: Vec<Option<Replica>> = configs
            .iter()
            .map(|c| Some(Replica::start(c).expect("replica")))
            .collect();
        let mut isolated: Option<usize> = None;
        for k in 0..=FAILOVERS {
            // Whoever leads next.
            let (i, live) = {
                let [a, b, c] = &mut replicas[..] else {
                    unreachable!("three replicas")
                };
                let (a, b, c) = (
                    a.as_mut().expect("replica 0"),
                    b.as_mut().expect("replica 1"),
                    c.as_mut().expect("replica 2"),
                );
                tokio::time::timeout(Duration::from_secs(10), async {
                    tokio::select! {
                        live = a.lead(None) => (0, live),
                        live = b.lead(None) => (1, live),
                        live = c.lead(None) => (2, live),
                    }
                })
                .await
                .unwrap_or_else(|_| panic!("failover {k}: nobody led within 10 s"))
            };
            let started = Instant::now();
            let live = live.unwrap_or_else(|e| panic!("failover {k}: replica {i}: {e}"));
            let won = match &*replicas[i].as_ref().expect("the leader").role().borrow() {
                poolgate::ha::replica::Role::Leading(since) => *since,
                other => panic!("failover {k}: replica {i} started an orchestrator as {other:?}"),
            };
            assert_ne!(Some(i), isolated, "an isolated replica led");
            // The isolated replica is healed once another leads.
            if let Some(j) = isolated.take() {
                proxies[j].set_cut(false);
            }
            let mut events = live.gate.subscribe();
            make_ready(&live.gate, "node-1").await;
            let mut epochs = Vec::new();
            let mut faulted = false;
            // The pool is ready in this term (an epoch stored and told).
            loop {
                match tokio::time::timeout(Duration::from_secs(5), events.recv()).await {
                    Ok(Some(Event::PoolReady { epoch, .. })) => {
                        epochs.push(epoch.0);
                        break;
                    }
                    Ok(Some(Event::RunFaulted { .. })) => faulted = true,
                    Ok(Some(_)) => {}
                    other => panic!("failover {k}: no pool_ready in the term ({other:?})"),
                }
            }
            let report = live.gate.report().await.unwrap();
            if k == 0 {
                let epoch = poolgate::core::Epoch(epochs[0]);
                live.gate
                    .begin_planning(run.clone(), Some(epoch))
                    .await
                    .unwrap();
                live.gate
                    .commit_plan(run.clone(), vec![node.clone()], Some(epoch))
                    .await
                    .unwrap();
            } else {
                assert_eq!(
                    report.run.as_ref(),
                    Some(&run),
                    "failover {k}: the run was not restored"
                );
            }
            if k == FAILOVERS {
                terms.push(TermSeen {
                    replica: i,
                    won,
                    started,
                    ended: Instant::now(),
                    epochs,
                    faulted,
                });
                live.shutdown();
                break;
            }
            let force = match rng.random_range(0..3) {
                0 => Force::Stop,
                1 => Force::Crash,
                _ => Force::Isolate,
            };
            forces.push(force);
            let ended = match force {
                Force::Stop | Force::Crash => {
                    let ended = Instant::now();
                    live.shutdown();
                    let replica = replicas[i].take().expect("the leader");
                    if matches!(force, Force::Stop) {
                        replica.resign();
                    } else {
                        replica.abandon();
                    }
                    replicas[i] = Some(Replica::start(&configs[i]).expect("restart"));
                    ended
                }
                Force::Isolate => {
                    proxies[i].set_cut(true);
                    isolated = Some(i);
                    let leader = replicas[i].as_ref().expect("the leader");
                    tokio::time::timeout(Duration::from_secs(3), leader.lost())
                        .await
                        .unwrap_or_else(|_| panic!("failover {k}: an isolated leader kept acting"));
                    let ended = Instant::now();
                    live.shutdown();
                    ended
                }
            };
            // Whatever else the term published before it ended.
            while let Ok(event) = events.try_recv() {
                if let Event::RunFaulted { .. } = event {
                    faulted = true;
                }
            }
            terms.push(TermSeen {
                replica: i,
                won,
                started,
                ended,
                epochs,
                faulted,
            });
        }
        for replica in replicas.into_iter().flatten() {
            replica.resign();
        }
    });

    // Terms never overlap, and the gap between them is bounded.
    let mut gaps = Vec::new();
    for (k, pair) in terms.windows(2).enumerate() {
        assert!(
            pair[1].won > pair[0].ended,
            "failover {k} ({:?}): replica {} won {:?} before replica {} stopped acting",
            forces[k],
            pair[1].replica,
            pair[0].ended - pair[1].won,
            pair[0].replica
        );
        gaps.push(pair[1].started - pair[0].ended);
    }
    // Every epoch once, each term's above every earlier one.
    let epochs: Vec<u64> = terms.iter().flat_map(|t| t.epochs.clone()).collect();
    assert!(
        epochs.windows(2).all(|w| w[1] > w[0]),
        "epochs issued twice or backwards: {epochs:?}"
    );
    assert!(
        terms.iter().all(|t| !t.faulted),
        "a takeover faulted the run"
    );
    gaps.sort();
    let max = *gaps.last().expect("gaps");
    eprintln!(
        "{} failovers (seed {seed}; {} stops, {} crashes, {} isolations): terms never overlapped; guard gap p50 {:?}, max {:?}",
        gaps.len(),
        forces.iter().filter(|f| matches!(f, Force::Stop)).count(),
        forces.iter().filter(|f| matches!(f, Force::Crash)).count(),
        forces.iter().filter(|f| matches!(f, Force::Isolate)).count(),
        gaps[gaps.len() / 2],
        max
    );
    assert!(
        max <= Duration::from_secs(4),
        "a run went unguarded {max:?}"
    );
}

/// Issue 28, reproduction 1: a leader cut off from etcd issues an epoch it
/// cannot store (the write is tried again every second), steps down, and
/// leads again once healed. The write prepared in the first term must
/// never land in the second: etcd's last epoch went down (4→3, 8→7) and a
/// replica restarted fresh told an epoch a second time.
#[test]
fn a_write_prepared_in_an_earlier_term_never_lands_in_a_later_one() {
    need_etcd!();
    let _one_at_a_time = one_at_a_time();
    let server = etcd::Etcd::start("past-write");
    let proxy = etcd::Proxy::start(server.port());
    let config = config(&proxy.endpoint());
    let endpoint = server.endpoint.clone();
    let stored = move || {
        let client =
            poolgate::ha::etcd::Etcd::new(std::slice::from_ref(&endpoint), Duration::from_secs(2));
        let store = poolgate::state::etcd::EtcdStore::new(
            Arc::new(client.expect("client")),
            "/poolgate/failovers/pool-a/",
            "failovers",
            "pool-a",
            Arc::new(poolgate::state::etcd::Fence::default()),
        );
        store.read().expect("the state reads").0.last_epoch
    };
    live_for(Duration::from_secs(60), async {
        let mut replica = Replica::start(&config).unwrap();
        let live = replica.lead(None).await.unwrap();
        let mut events = live.gate.subscribe();
        make_ready(&live.gate, "node-1").await;
        let first = common::live::ready(&mut events).await;

        // Cut off from etcd while it still may act: a new epoch is
        // issued, its write fails and waits to be tried again.
        proxy.set_cut(true);
        bounce(&live.gate).await;
        tokio::time::timeout(Duration::from_secs(5), replica.lost())
            .await
            .expect("a leader cut off from etcd stops acting");
        live.stop().await;

        // Healed: the same replica leads again and issues two epochs.
        proxy.set_cut(false);
        let live = tokio::time::timeout(Duration::from_secs(15), replica.lead(None))
            .await
            .expect("the replica leads again")
            .unwrap();
        let mut events = live.gate.subscribe();
        make_ready(&live.gate, "node-1").await;
        let again = common::live::ready(&mut events).await;
        bounce(&live.gate).await;
        let last = common::live::ready(&mut events).await;
        assert!(
            first < again && again < last,
            "{first:?} {again:?} {last:?}"
        );

        // The first term's write is tried every second: for three of its
        // tries, etcd must keep the last epoch told.
        let until = std::time::Instant::now() + Duration::from_secs(3);
        while std::time::Instant::now() < until {
            let held = tokio::task::spawn_blocking(stored.clone()).await.unwrap();
            assert!(
                held >= last.0,
                "etcd's last epoch went down to {held} after epoch {} was told: a write from an earlier term landed",
                last.0
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        live.stop().await;
        replica.resign();
    });
}

/// node-1 dead, then alive again: readiness lost, then a new epoch.
async fn bounce(gate: &poolgate::Gate) {
    use poolgate::core::SwimState;
    common::swim(gate, "node-1", SwimState::Dead, 1).await;
    common::swim(gate, "node-1", SwimState::Alive, 2).await;
}
