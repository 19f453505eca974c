//! Orchestrator replicas on a real etcd (design §12), in one process: one
//! leader at a time, writes fenced by leadership, epochs continued across
//! a change of leader, and bad etcd input refused by name. Each test
//! starts its own etcd on 127.0.0.1 (free ports) and is bounded in time;
//! without the `etcd` binary each says so in one line. A hundred forced
//! failovers among three replicas are in `failovers.rs`.
//!
//! One test binary for these (each is linked once), their tests one at a
//! time ([`one_at_a_time`]).

#[path = "../common/mod.rs"]
mod common;
#[path = "../common/etcd.rs"]
#[macro_use]
mod etcd;

mod failovers;

use std::sync::Arc;
use std::time::Duration;

use poolgate::core::{Durable, Event};
use poolgate::ha::replica::Replica;
use poolgate::state::etcd::{EtcdStore, Fence, LeaderTerm};
use poolgate::{Config, StateStore};

use common::live::{live_for, ready};
use common::make_ready;

/// The tests here run one at a time: each drives etcd members and lease
/// deadlines of a few seconds, which two at once on a 2-core machine can
/// starve (a renewal answered late deposes a leader the test keeps); the
/// hundred failovers time their takeovers, which another etcd and
/// replica at the same moment would stretch.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ONE.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn config(endpoint: &str, extra: &str) -> Config {
    config_of(&[endpoint.to_string()], extra, "2s")
}

fn config_of(endpoints: &[String], extra: &str, lease: &str) -> Config {
    etcd::replica_config(endpoints, "replicas", "50ms", lease, extra)
}

/// Leads with whichever of `a` and `b` wins; which one it was.
async fn first_leader(a: &mut Replica, b: &mut Replica) -> (bool, poolgate::live::Orchestrator) {
    tokio::select! {
        live = a.lead(None) => (true, live.expect("a leads")),
        live = b.lead(None) => (false, live.expect("b leads")),
    }
}

#[test]
fn one_replica_leads_a_deposed_write_changes_nothing_and_epochs_continue() {
    need_etcd!();
    let _one_at_a_time = one_at_a_time();
    let server = etcd::Etcd::start("leads");
    let config = config(&server.endpoint, "");
    live_for(Duration::from_secs(60), async {
        let mut a = Replica::start(&config).unwrap();
        let mut b = Replica::start(&config).unwrap();
        let (a_leads, live) = first_leader(&mut a, &mut b).await;
        assert_ne!(a.leads(), b.leads(), "exactly one replica leads");
        assert_eq!(a.leads(), a_leads);
        let mut events = live.gate.subscribe();
        make_ready(&live.gate, "node-1").await;
        let first = ready(&mut events).await;

        // A write from a term that is over (another create revision of the
        // leader key) is refused by etcd and changes nothing.
        let deposed = Arc::new(Fence::default());
        deposed.set(LeaderTerm {
            created: 1,
            until: std::time::Instant::now() + Duration::from_secs(60),
        });
        let (stale, _) = EtcdStore::new(
            Arc::new(server.client()),
            "/poolgate/replicas/pool-a/",
            "replicas",
            "pool-a",
            deposed,
        )
        .bind(1)
        .unwrap();
        let refused = stale.save(&Durable {
            last_epoch: 1_000,
            run: None,
        });
        assert!(refused.is_err(), "a deposed leader's write went through");
        let (held, _) = stale.read().unwrap();
        assert_eq!(
            held.last_epoch, first.0,
            "the refused write changed the state"
        );

        // The leader resigns: the other leads at once, above every epoch.
        live.shutdown();
        let (mut leader, other) = if a_leads { (b, a) } else { (a, b) };
        other.resign();
        let live = tokio::time::timeout(Duration::from_secs(5), leader.lead(None))
            .await
            .expect("the other replica leads within the lease")
            .unwrap();
        let mut events = live.gate.subscribe();
        make_ready(&live.gate, "node-1").await;
        let second = ready(&mut events).await;
        assert!(
            second > first,
            "epoch {second:?} after {first:?}: issued twice"
        );
        live.shutdown();
        leader.resign();
    });
}

#[test]
fn a_leader_stops_acting_when_its_key_is_gone_and_refuses_wiped_data() {
    need_etcd!();
    let _one_at_a_time = one_at_a_time();
    let server = etcd::Etcd::start("wiped");
    let config = config(&server.endpoint, "");
    live_for(Duration::from_secs(60), async {
        let mut replica = Replica::start(&config).unwrap();
        let live = replica.lead(None).await.unwrap();
        // A follower that started before any epoch was issued.
        let mut follower = Replica::start(&config).unwrap();
        let mut events = live.gate.subscribe();
        make_ready(&live.gate, "node-1").await;
        let epoch = ready(&mut events).await;
        assert!(epoch.0 >= 1);
        // etcd's data wiped under the running leader.
        let deleted = server
            .client()
            .delete_prefix(b"/poolgate/replicas/pool-a/")
            .unwrap();
        assert!(deleted >= 2);
        tokio::time::timeout(Duration::from_secs(3), replica.lost())
            .await
            .expect("the leader stops acting once its key is gone");
        live.shutdown();
        assert!(
            live_stopped(&mut events).await,
            "events after stepping down"
        );
        // Whichever leads next (the old leader, or the follower that never
        // led) will not issue epoch 1 again; nor the other, once the first
        // has resigned.
        let refused =
            |who: &str, led: Result<poolgate::live::Orchestrator, poolgate::live::LiveError>| {
                let text = match led {
                    Ok(_) => panic!("{who} led on wiped data"),
                    Err(e) => e.to_string(),
                };
                assert!(
                    text.contains("wiped") && text.contains(&server.endpoint),
                    "{who}: {text}"
                );
            };
        let first = tokio::time::timeout(Duration::from_secs(10), async {
            tokio::select! {
                led = replica.lead(None) => (true, led),
                led = follower.lead(None) => (false, led),
            }
        })
        .await
        .expect("an answer");
        let (mut other, done) = if first.0 {
            refused("the old leader", first.1);
            (follower, replica)
        } else {
            refused("the follower", first.1);
            (replica, follower)
        };
        done.resign();
        let second = tokio::time::timeout(Duration::from_secs(10), other.lead(None))
            .await
            .expect("an answer");
        refused("the other replica", second);
        other.resign();
    });
}

/// What became of `run`, once it is `status`.
async fn outcome_of(
    requests: &poolgate::ha::requests::Requests,
    run: &poolgate::core::RunId,
    status: &str,
) -> poolgate::ha::requests::RunOutcome {
    loop {
        if let Ok(Some(o)) = requests.outcome(run).await {
            if o.status == status {
                return o;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Whether the stream ended with nothing more published.
async fn live_stopped(events: &mut poolgate::EventStream) -> bool {
    loop {
        match events.recv().await {
            None => return true,
            Some(Event::PoolReady { .. }) => return false,
            Some(_) => continue,
        }
    }
}

#[test]
fn bad_etcd_input_at_start_is_an_error_naming_the_endpoint_or_key() {
    need_etcd!();
    let _one_at_a_time = one_at_a_time();
    // Unreachable endpoints.
    let port = etcd::free_port();
    let dead = format!("http://127.0.0.1:{port}");
    let error = Replica::start(&config(&dead, "")).unwrap_err().to_string();
    assert!(
        error.contains(&dead) && error.contains("unreachable"),
        "{error}"
    );

    let server = etcd::Etcd::start("bad");
    let client = server.client();
    // A newer format under the prefix.
    client.put(b"/newer/format", b"99").unwrap();
    let error = Replica::start(&config(&server.endpoint, "prefix = \"/newer/\""))
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("/newer/format") && error.contains("newer"),
        "{error}"
    );
    // Another cluster's prefix.
    client.put(b"/theirs/format", b"2").unwrap();
    client
        .put(b"/theirs/cluster", br#"{"label":"other","pool":"pool-z"}"#)
        .unwrap();
    let error = Replica::start(&config(&server.endpoint, "prefix = \"/theirs/\""))
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("/theirs/cluster") && error.contains("another cluster"),
        "{error}"
    );
    // A damaged record.
    client.put(b"/damaged/format", b"2").unwrap();
    client
        .put(
            b"/damaged/cluster",
            br#"{"label":"replicas","pool":"pool-a"}"#,
        )
        .unwrap();
    client
        .put(b"/damaged/state", br#"{"last_epoch":7,"run":null}"#)
        .unwrap();
    client
        .put(b"/damaged/state.sha256", b"not the sum")
        .unwrap();
    let error = Replica::start(&config(&server.endpoint, "prefix = \"/damaged/\""))
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("/damaged/state") && error.contains("checksum"),
        "{error}"
    );
}

#[test]
fn a_three_member_etcd_losing_one_changes_nothing_and_losing_quorum_stops_everyone_until_it_returns(
) {
    need_etcd!();
    let _one_at_a_time = one_at_a_time();
    let mut cluster = etcd::Cluster::start("quorum", 3);
    let endpoints = cluster.endpoints();
    // A 4 s lease: etcd on this test's loaded machine answers a renewal
    // within the deadline (2/3 of it) even while a member is gone.
    let config = config_of(&endpoints, "", "4s");
    // A member that is not etcd's raft leader (losing the raft leader
    // costs an election of about a second, which a 2 s lease may not
    // ride out: docs/operator.md), asked right before it is killed: on a loaded
    // machine etcd's leadership can move while the replicas start.
    let a_follower = |endpoints: &[String]| {
        (0..3)
            .find(|i| {
                let one =
                    poolgate::ha::etcd::Etcd::new(&endpoints[*i..=*i], Duration::from_secs(2))
                        .unwrap();
                !one.member_is_leader().unwrap()
            })
            .expect("a follower member")
    };
    live_for(Duration::from_secs(120), async {
        let mut a = Replica::start(&config).unwrap();
        let mut b = Replica::start(&config).unwrap();
        let (a_leads, live) = first_leader(&mut a, &mut b).await;
        let mut events = live.gate.subscribe();
        make_ready(&live.gate, "node-1").await;
        let first = ready(&mut events).await;
        let (leader, other) = if a_leads {
            (&mut a, &mut b)
        } else {
            (&mut b, &mut a)
        };

        let follower = a_follower(&endpoints);
        cluster.kill(follower);
        let kept = tokio::time::timeout(Duration::from_secs(4), leader.lost()).await;
        assert!(
            kept.is_err(),
            "losing one of three members deposed the leader"
        );
        assert!(leader.leads() && !other.leads());

        // A second member gone: no quorum. The leader steps down within
        // its renew deadline, and nobody leads.
        let second = (0..3).find(|i| *i != follower).expect("another member");
        cluster.kill(second);
        tokio::time::timeout(Duration::from_secs(5), leader.lost())
            .await
            .expect("without quorum the leader stops acting");
        live.shutdown();
        let nobody =
            tokio::time::timeout(Duration::from_secs(4), first_leader(leader, other)).await;
        assert!(nobody.is_err(), "a replica led without quorum");

        // Quorum back: leadership resumes, epochs above the first.
        cluster.restart(follower);
        cluster.restart(second);
        let (_, live) = tokio::time::timeout(Duration::from_secs(30), first_leader(&mut a, &mut b))
            .await
            .expect("leadership resumes once quorum returns");
        let mut events = live.gate.subscribe();
        make_ready(&live.gate, "node-1").await;
        let again = ready(&mut events).await;
        assert!(again > first, "epoch {again:?} after {first:?}");
        live.shutdown();
        a.resign();
        b.resign();
    });
}

/// A recording's bytes, shared with the test.
#[derive(Clone, Default)]
struct Buffer(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Buffer {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn the_term_after_a_takeover_replays_from_its_recording_event_for_event() {
    // Issue 22: each replica records what it applied while it led; the
    // term after a takeover starts from a restored state (an epoch, a
    // committed run), which its recording carries, so it replays alone.
    use poolgate::replay::{self, render::json_line, ReplayEvent};
    need_etcd!();
    let _one_at_a_time = one_at_a_time();
    let server = etcd::Etcd::start("replayed");
    let config = config(&server.endpoint, "restore_grace = \"5s\"\n");
    let buffer = Buffer::default();
    let mut live_lines = Vec::new();
    live_for(Duration::from_secs(60), async {
        let mut a = Replica::start(&config).unwrap();
        let live = a.lead(None).await.unwrap();
        let mut events = live.gate.subscribe();
        make_ready(&live.gate, "node-1").await;
        let epoch = ready(&mut events).await;
        let run = poolgate::core::RunId::new("r1").unwrap();
        let node = poolgate::core::NodeId::new("node-1").unwrap();
        live.gate
            .begin_planning(run.clone(), Some(epoch))
            .await
            .unwrap();
        live.gate
            .commit_plan(run.clone(), vec![node.clone()], Some(epoch))
            .await
            .unwrap();
        live.shutdown();
        a.resign();

        let mut b = Replica::start(&config).unwrap();
        let recording = poolgate::Recording::new(Box::new(buffer.clone()));
        let live = b.lead(Some(recording)).await.unwrap();
        let mut events = live.gate.subscribe();
        make_ready(&live.gate, "node-1").await;
        loop {
            let event = events.recv().await.expect("the term's events");
            let (ready, faulted) = (
                matches!(event, Event::PoolReady { .. }),
                matches!(event, Event::RunFaulted { .. }),
            );
            live_lines.push(json_line(&ReplayEvent::Gate(event)));
            if ready {
                let lost = poolgate::core::AgentReport::Unavailable { node: node.clone() };
                live.gate.agent(lost).await.unwrap();
            }
            if faulted {
                break;
            }
        }
        live.shutdown();
        b.resign();
    });
    let recorded = buffer.0.lock().unwrap().clone();
    let text = String::from_utf8(recorded.clone()).unwrap();
    assert!(
        text.lines().nth(1).unwrap().contains("\"restored\""),
        "{text}"
    );
    let mut replayed = Vec::new();
    replay::run(&config, &recorded[..], |event| {
        replayed.push(json_line(event));
        Ok(())
    })
    .unwrap();
    assert!(
        live_lines
            .iter()
            .any(|l| l.contains("pool_ready") && !l.contains("\"epoch\":1,")),
        "{live_lines:#?}"
    );
    assert_eq!(live_lines, replayed);
}

#[test]
fn a_run_asked_through_etcd_is_committed_by_the_leader_and_ended_on_request() {
    // design §12: `run` among replicas has the leader plan and commit for
    // it; the leader writes what became of it; an end asked for is done.
    need_etcd!();
    let _one_at_a_time = one_at_a_time();
    let server = etcd::Etcd::start("requests");
    let config = config(&server.endpoint, "");
    live_for(Duration::from_secs(60), async {
        let mut leader = Replica::start(&config).unwrap();
        let live = leader.lead(None).await.unwrap();
        let requests = poolgate::ha::replica::requests_of(&config).unwrap();
        let run = poolgate::core::RunId::new("asked").unwrap();
        let node = poolgate::core::NodeId::new("node-1").unwrap();
        let session = requests
            .ask(&run, std::slice::from_ref(&node), Duration::from_secs(2))
            .await
            .unwrap();
        // Not ready yet: asked, not committed.
        let outcome = |status: &'static str| {
            let requests = requests.clone();
            let run = run.clone();
            async move {
                loop {
                    if let Some(o) = requests.outcome(&run).await.unwrap() {
                        if o.status == status {
                            return o;
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        };
        assert!(requests.outcome(&run).await.unwrap().is_none());
        make_ready(&live.gate, "node-1").await;
        let committed = tokio::time::timeout(Duration::from_secs(5), outcome("committed"))
            .await
            .expect("the leader committed the requested run");
        assert!(matches!(committed.event, Some(Event::RunCommitted { .. })));
        assert_eq!(live.gate.report().await.unwrap().run, Some(run.clone()));
        requests.finish(&run).await.unwrap();
        let finished = tokio::time::timeout(Duration::from_secs(5), outcome("finished"))
            .await
            .expect("the leader ended the run");
        assert!(matches!(finished.event, Some(Event::RunFinished { .. })));
        assert_eq!(live.gate.report().await.unwrap().run, None);
        // An end asked for a run the leader does not hold is taken up and
        // dropped.
        let stranger = poolgate::core::RunId::new("stranger").unwrap();
        requests.finish(&stranger).await.unwrap();
        tokio::time::timeout(Duration::from_secs(5), async {
            while requests.finish_pending(&stranger).await.unwrap() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await
        .expect("the leader took up the end");
        assert!(requests.outcome(&stranger).await.unwrap().is_none());
        drop(session);

        // A run asked of a pool the leader does not gate is refused, said
        // by name (design §14: requests carry their pool).
        let other = poolgate::core::RunId::new("other-pool").unwrap();
        let elsewhere = poolgate::core::PoolId::new("elsewhere").unwrap();
        let session = requests
            .ask_of(
                Some(&elsewhere),
                &other,
                std::slice::from_ref(&node),
                Duration::from_secs(2),
            )
            .await
            .unwrap();
        let refused = tokio::time::timeout(
            Duration::from_secs(5),
            outcome_of(&requests, &other, "refused"),
        )
        .await
        .expect("refused");
        let reason = refused.reason.unwrap_or_default();
        assert!(reason.contains("no pool elsewhere"), "{reason}");
        drop(session);

        // A committed run whose requester is gone for good (its session
        // revoked or expired) is ended by the leader, its end written
        // with the reason (docs/failover.md §3: the requester had
        // stopped its command).
        let ghost = poolgate::core::RunId::new("ghost").unwrap();
        let session = requests
            .ask(&ghost, std::slice::from_ref(&node), Duration::from_secs(2))
            .await
            .unwrap();
        tokio::time::timeout(Duration::from_secs(5), async {
            while live.gate.report().await.unwrap().run.as_ref() != Some(&ghost) {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await
        .expect("committed");
        drop(session);
        tokio::time::timeout(Duration::from_secs(5), async {
            while live.gate.report().await.unwrap().run.is_some() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await
        .expect("the leader ends the run of a requester gone for good");
        let ended = tokio::time::timeout(
            Duration::from_secs(5),
            outcome_of(&requests, &ghost, "ended"),
        )
        .await
        .expect("the end written");
        assert_eq!(
            ended.reason.as_deref(),
            Some(poolgate::ha::requests::REQUESTER_GONE)
        );
        // A requester that withdraws after a commit it did not see (its
        // timeout raced the leader) has the run ended.
        let late = poolgate::core::RunId::new("late").unwrap();
        let session = requests
            .ask(&late, std::slice::from_ref(&node), Duration::from_secs(2))
            .await
            .unwrap();
        tokio::time::timeout(Duration::from_secs(5), async {
            while live.gate.report().await.unwrap().run.as_ref() != Some(&late) {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await
        .expect("committed");
        requests.withdraw(&late).await.unwrap();
        tokio::time::timeout(Duration::from_secs(5), async {
            while live.gate.report().await.unwrap().run.is_some() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await
        .expect("the leader ended the run withdrawn after its commit");
        drop(session);
        // A plan that can never be committed is refused, not left planning.
        let stray = poolgate::core::RunId::new("stray").unwrap();
        let _session = requests
            .ask(
                &stray,
                &[poolgate::core::NodeId::new("node-9").unwrap()],
                Duration::from_secs(2),
            )
            .await
            .unwrap();
        let refused = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                if let Some(o) = requests.outcome(&stray).await.unwrap() {
                    return o;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await
        .expect("an answer");
        assert_eq!(refused.status, "refused");
        assert!(refused.reason.unwrap().contains("node-9"));
        assert_eq!(live.gate.report().await.unwrap().run, None);
        live.shutdown();
        leader.resign();
    });
}

#[test]
fn a_follower_is_a_warm_swim_member_and_its_next_term_starts_from_that_view() {
    // Issue 22: followers stay warm, a SWIM member of the cluster with its
    // view while following (here it joins through the leader's member, its
    // only seed), and the term after a takeover runs on that member and
    // starts from its view: the pool is ready again on it.
    need_etcd!();
    let _one_at_a_time = one_at_a_time();
    let server = etcd::Etcd::start("warm");
    live_for(Duration::from_secs(60), async {
        // The node reaches either replica's listener; its SWIM seed is the
        // first leader's member alone.
        let (mut cluster, first, second) = two_replicas_one_node(&server).await;

        let mut a = Replica::start(&first).unwrap();
        let live = a.lead(None).await.unwrap();
        let mut events = live.gate.subscribe();
        let mut b = Replica::start(&second).unwrap();
        b.warm_up().await.unwrap();
        let warm = b.swim_addr().expect("the follower's member is up");
        cluster.spawn(0).unwrap();
        ready(&mut events).await;
        // The follower's member learns of node-1 from the leader's.
        let count = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                if b.swim_members().await.unwrap_or(0) >= 2 {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        assert!(
            count.is_ok(),
            "the follower's member never learnt the cluster"
        );
        // The leader goes, its member with it.
        live.stop().await;
        a.resign();
        let next = tokio::time::timeout(Duration::from_secs(5), b.lead(None))
            .await
            .expect("b leads")
            .unwrap();
        assert_eq!(next.swim_addr, warm, "the term uses the warm member");
        let mut events = next.gate.subscribe();
        tokio::time::timeout(Duration::from_secs(10), ready(&mut events))
            .await
            .expect("the new term's pool is ready, from the warm member's view");
        next.stop().await;
        // The member outlives the term: a follower's again.
        assert_eq!(b.swim_addr(), Some(warm));
        b.resign();
        cluster.kill(0);
    });
}

#[test]
fn a_followers_member_accuses_no_node_and_the_leaders_vouches_for_its_own() {
    // Design §15: a probe unanswered over UDP falls back on the probed
    // node's agent connection, which only the leader holds; a follower's
    // warm member accuses nobody. Node-1 advertises a SWIM address nobody
    // reads (a port this test holds): every probe of it goes unanswered,
    // and it can refute nothing. Before, the follower's probes made it
    // suspect, the gossip reached the leader, and the pool lost readiness.
    need_etcd!();
    let _one_at_a_time = one_at_a_time();
    let server = etcd::Etcd::start("vouch");
    live_for(Duration::from_secs(60), async {
        let (mut cluster, first, second) = two_replicas_one_node(&server).await;
        let blackhole = unreachable_swim(&cluster);

        let mut a = Replica::start(&first).unwrap();
        let live = a.lead(None).await.unwrap();
        let mut events = live.gate.subscribe();
        cluster.spawn(0).unwrap();
        ready(&mut events).await;
        // The follower joins through the leader's member, whose answer
        // lists node-1 (gossip alone could spend itself on node-1's
        // address, which nobody reads).
        let mut b = Replica::start(&second).unwrap();
        b.warm_up().await.unwrap();
        let learnt = tokio::time::timeout(Duration::from_secs(5), async {
            while b.swim_members().await.unwrap_or(0) < 2 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        assert!(learnt.is_ok(), "the follower's member never learnt node-1");
        // Fifty probe periods (200 ms): each member probes node-1 many
        // times, every probe unanswered; nobody suspects it.
        let lost = tokio::time::timeout(
            Duration::from_secs(10),
            common::live::until(&mut events, |e| match e {
                Event::ReadinessLost { node, reason, .. } => Some((node.clone(), *reason)),
                _ => None,
            }),
        )
        .await;
        assert!(lost.is_err(), "readiness lost: {lost:?}");
        live.stop().await;
        a.resign();
        b.resign();
        cluster.kill(0);
        drop(blackhole);
    });
}

#[test]
fn a_takeover_faults_no_run_over_a_node_that_has_not_reconnected_yet() {
    // An operator's finding: under UDP loss, a new leader's member probed
    // the nodes before their agents had reconnected to it, found no frame
    // to vouch by, and the restored run faulted `suspect` 2.5 s into the
    // term. Node-1 advertises a SWIM address nobody reads (every probe of
    // it unanswered, as under total loss); the run over it survives the
    // takeover, and a real loss still faults it.
    need_etcd!();
    let _one_at_a_time = one_at_a_time();
    let server = etcd::Etcd::start("takeover");
    live_for(Duration::from_secs(60), async {
        let (cluster, first, second) = two_replicas_one_node(&server).await;
        let blackhole = unreachable_swim(&cluster);
        let mut taken =
            committed_then_taken_over(&server, cluster, (&first, &second), |_| {}).await;
        let faulted = tokio::time::timeout(
            Duration::from_secs(8),
            common::live::until(&mut taken.events, |e| match e {
                Event::RunFaulted { node, reason, .. } => Some((node.clone(), *reason)),
                _ => None,
            }),
        )
        .await;
        assert!(faulted.is_err(), "the run faulted: {faulted:?}");
        // Still guarded: node-1 killed, its connection's loss faults the
        // run at once.
        taken.cluster.kill(0);
        let faulted = tokio::time::timeout(
            Duration::from_secs(3),
            common::live::until(&mut taken.events, |e| match e {
                Event::RunFaulted { node, reason, .. } => Some((node.clone(), *reason)),
                _ => None,
            }),
        )
        .await
        .expect("the run faults at once");
        assert_eq!(
            (faulted.0.as_str(), faulted.1),
            ("node-1", poolgate::core::Reason::Unavailable)
        );
        taken.end().await;
        drop(blackhole);
    });
}

#[test]
fn a_required_node_restarted_while_no_replica_leads_faults_the_restored_run() {
    // An operator's finding: the leader killed, and a required node
    // killed and started again before any replica led; the new leader
    // never heard the first process go, saw the second ready with the
    // committed identity, and confirmed the run. Its first frame is of
    // another life of sequences than the store held: the run faults.
    need_etcd!();
    let _one_at_a_time = one_at_a_time();
    let server = etcd::Etcd::start("unheard");
    live_for(Duration::from_secs(60), async {
        let (cluster, first, second) = two_replicas_one_node(&server).await;
        let mut taken = committed_then_taken_over(&server, cluster, (&first, &second), |cluster| {
            cluster.kill(0);
            cluster.spawn(0).unwrap();
        })
        .await;
        let faulted = tokio::time::timeout(
            Duration::from_secs(8),
            common::live::until(&mut taken.events, |e| match e {
                Event::RunFaulted { node, reason, .. } => Some((node.clone(), *reason)),
                _ => None,
            }),
        )
        .await
        .expect("the run faults before the restore grace ends, not confirmed");
        assert_eq!(
            (faulted.0.as_str(), faulted.1),
            ("node-1", poolgate::core::Reason::Faulted)
        );
        // The node itself is fine: the pool is ready again.
        ready(&mut taken.events).await;
        taken.end().await;
    });
}

/// A run over node-1 restored by the second replica's term.
struct TakenOver {
    cluster: poolgate::cli::cluster::LocalCluster,
    b: Replica,
    next: poolgate::live::Orchestrator,
    events: poolgate::EventStream,
}

impl TakenOver {
    async fn end(self) {
        self.next.stop().await;
        self.b.resign();
    }
}

/// On `cluster` (node-1 not started) and its replicas' configs: the first
/// leads, node-1 starts, and a run is committed over it once the pool is
/// ready and its frames are in etcd; the second replica is warmed up; the
/// first stops (its lease revoked); `meanwhile` is done to the cluster
/// while no replica leads; then the second leads, the run restored.
async fn committed_then_taken_over(
    server: &etcd::Etcd,
    mut cluster: poolgate::cli::cluster::LocalCluster,
    (first, second): (&Config, &Config),
    meanwhile: impl FnOnce(&mut poolgate::cli::cluster::LocalCluster),
) -> TakenOver {
    let mut a = Replica::start(first).unwrap();
    let live = a.lead(None).await.unwrap();
    let mut events = live.gate.subscribe();
    cluster.spawn(0).unwrap();
    let epoch = ready(&mut events).await;
    let run = poolgate::core::RunId::new("over-a-takeover").unwrap();
    live.gate
        .begin_planning(run.clone(), Some(epoch))
        .await
        .unwrap();
    live.gate
        .commit_plan(run.clone(), vec![common::node("node-1")], Some(epoch))
        .await
        .unwrap();
    stored_sequence_of(server, first, "node-1").await;
    let mut b = Replica::start(second).unwrap();
    b.warm_up().await.unwrap();
    live.stop().await;
    a.resign();
    meanwhile(&mut cluster);
    let next = tokio::time::timeout(Duration::from_secs(10), b.lead(None))
        .await
        .expect("b leads")
        .unwrap();
    let events = next.gate.subscribe();
    assert_eq!(next.gate.report().await.unwrap().run, Some(run), "restored");
    TakenOver {
        cluster,
        b,
        next,
        events,
    }
}

/// Asks for `run` over node-1 as a requester does (its request and its
/// presence on a lease of `ttl`), and leaves the lease to expire as a
/// requester SIGKILLed right after would (a dropped `Session` revokes it).
fn asked_by_a_requester_killed_at_once(
    store: &EtcdStore,
    run: &poolgate::core::RunId,
    ttl: Duration,
) -> i64 {
    let (lease, _) = store.etcd().grant(ttl).unwrap();
    let body = serde_json::json!({ "required": ["node-1"], "lease": lease }).to_string();
    store
        .put_raw_all(
            &[
                (&format!("alive/{run}"), b"{}"),
                (&format!("requests/{run}"), body.as_bytes()),
            ],
            lease,
        )
        .unwrap();
    lease
}

/// Waits (bounded) until `lease`, of 6 s, reads stale: renewed by nobody
/// for three tenths of its TTL and a second.
async fn until_stale(store: &EtcdStore, lease: i64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let left = store
            .etcd()
            .time_to_live(lease)
            .unwrap()
            .map(|(left, _)| left);
        if left.is_some_and(|left| left <= Duration::from_secs(3)) {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "{left:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Whether `run` is planned (`planning_started`) within `within`.
async fn planned_within(
    events: &mut poolgate_actors::EventStream,
    run: &poolgate::core::RunId,
    within: Duration,
) -> bool {
    let planned = common::live::until(events, |e| match e {
        Event::PlanningStarted { run: started, .. } if started == run => Some(()),
        _ => None,
    });
    tokio::time::timeout(within, planned).await.is_ok()
}

/// Asks `run` over node-1 as a requester that renews its session (of
/// `ttl`), and waits for its commit; the session.
async fn committed_for(
    requests: &poolgate::ha::requests::Requests,
    events: &mut poolgate_actors::EventStream,
    run: &str,
    ttl: Duration,
) -> poolgate::ha::requests::Session {
    let run = poolgate::core::RunId::new(run).unwrap();
    let session = requests
        .ask(&run, &[common::node("node-1")], ttl)
        .await
        .unwrap();
    common::live::until(events, |e| match e {
        Event::RunCommitted { run: committed, .. } if *committed == run => Some(()),
        _ => None,
    })
    .await;
    session
}

/// A store on `config`'s prefix, bound to no term (it reads, and writes
/// what needs no term).
/// What is left of the lease the leader key is on, and the TTL it was
/// granted; `None` when no replica leads (or etcd does not answer).
fn leader_lease(store: &EtcdStore) -> Option<(Duration, Duration)> {
    let lease = store.get_raw_of_leader("cluster").ok()?.leader_lease?;
    store.lease_left(lease).ok().flatten()
}

fn store_of(server: &etcd::Etcd, config: &Config) -> EtcdStore {
    store_on(server.client(), config)
}

/// A store on `config`'s prefix through `etcd`, bound to no term.
fn store_on(etcd: poolgate::ha::etcd::Etcd, config: &Config) -> EtcdStore {
    let prefix = format!("/poolgate/{}/{}/", config.swim.label, pool_of(config));
    EtcdStore::new(
        Arc::new(etcd),
        &prefix,
        &config.swim.label,
        &pool_of(config),
        Arc::new(Fence::default()),
    )
}

/// Waits (bounded) until etcd holds a frame sequence of `node` under
/// `config`'s prefix.
async fn stored_sequence_of(server: &etcd::Etcd, config: &Config, node: &str) {
    let store = store_of(server, config);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let stored = poolgate::state::OrchestratorStore::sequences(&store).unwrap_or_default();
        if stored.keys().any(|k| k.split('@').next() == Some(node)) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no sequence of {node} stored: {stored:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn pool_of(config: &Config) -> String {
    config.pool.id().to_string()
}

/// Ends `replica`'s term as a lapsed lease would (its `leader` key, the
/// full key `leader`, deleted on `server`), stops the term's
/// orchestrator `live`, and leads again: the next term's orchestrator.
async fn a_next_term(
    server: &etcd::Etcd,
    leader: &[u8],
    replica: &mut Replica,
    live: poolgate::live::Orchestrator,
) -> poolgate::live::Orchestrator {
    server.client().delete_prefix(leader).unwrap();
    tokio::time::timeout(Duration::from_secs(5), replica.lost())
        .await
        .expect("term lost");
    live.stop().await;
    tokio::time::timeout(Duration::from_secs(15), replica.lead(None))
        .await
        .expect("the replica leads again")
        .unwrap()
}

/// One real node process's files on 127.0.0.1 (not started yet) and a
/// replica config for it on `server` (the 2 s lease).
async fn one_node_cluster_on(
    server: &etcd::Etcd,
) -> (poolgate::cli::cluster::LocalCluster, Config) {
    let mut plan = common::live::plan(
        "[pool]\nid = \"pool-w\"\nmembers = [\"node-1\"]\n[readiness]\nconvergence_window = \"100ms\"\n\
         [swim]\nlabel = \"warm\"\nprobe_period = \"200ms\"\nprobe_rtt = \"60ms\"\n",
        1,
    );
    plan.external_orchestrator = true;
    let cluster = poolgate::cli::cluster::LocalCluster::prepare(&plan)
        .await
        .unwrap();
    let mut config = cluster.config.clone();
    config.state.etcd = vec![server.endpoint.clone()];
    config.state.lease = Duration::from_secs(2);
    config.state.insecure = true;
    (cluster, config)
}

/// [`one_node_cluster_on`] with a second replica's config: its SWIM member
/// and agent listener on free ports, the first replica's member its only
/// seed; node-1 reaches either replica's listener.
async fn two_replicas_one_node(
    server: &etcd::Etcd,
) -> (poolgate::cli::cluster::LocalCluster, Config, Config) {
    let (cluster, first) = one_node_cluster_on(server).await;
    let mut second = first.clone();
    let free = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
    };
    second.swim.bind = free();
    second.agents.listen = free();
    second.swim.seeds = vec![poolgate::live::endpoint::Endpoint::from(first.swim.bind)];
    let node_toml = std::fs::read_to_string(&cluster.nodes[0].config).unwrap();
    let listed = format!("agents = \"{}\"", first.agents.listen);
    assert!(node_toml.contains(&listed), "{node_toml}");
    let both = format!(
        "agents = [\"{}\", \"{}\"]",
        first.agents.listen, second.agents.listen
    );
    std::fs::write(&cluster.nodes[0].config, node_toml.replace(&listed, &both)).unwrap();
    (cluster, first, second)
}

/// Makes node-1 advertise a SWIM address nobody reads (a port the
/// returned socket holds; drop it at the end): every probe of it goes
/// unanswered, as under total UDP loss, while its agent connection works.
fn unreachable_swim(cluster: &poolgate::cli::cluster::LocalCluster) -> std::net::UdpSocket {
    let blackhole = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let node_toml = std::fs::read_to_string(&cluster.nodes[0].config).unwrap();
    let bind = "bind = \"127.0.0.1:0\"\n";
    assert!(node_toml.contains(bind), "{node_toml}");
    let advertised = format!(
        "{bind}advertise = \"{}\"\n",
        blackhole.local_addr().unwrap()
    );
    std::fs::write(
        &cluster.nodes[0].config,
        node_toml.replacen(bind, &advertised, 1),
    )
    .unwrap();
    blackhole
}

/// The first line of the file at `path` that holds `needle`, once it is
/// there (bounded by `within`).
fn line_in(path: &std::path::Path, needle: &str, within: Duration) -> Option<String> {
    let deadline = std::time::Instant::now() + within;
    while std::time::Instant::now() < deadline {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if let Some(line) = text.lines().find(|l| l.contains(needle)) {
            return Some(line.to_string());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

#[test]
fn watch_until_ready_in_a_process_that_does_not_lead_reads_what_the_leader_published() {
    // An operator's trial: among replicas, `watch --until-ready --timeout`
    // on a follower ran out with the pool ready (only the leader's gate
    // sees `PoolReady`), and beside the replica holding its host's sockets
    // it died binding them: a readiness check worked on one host only.
    // The next trial: with the leader frozen, its last record ("ready",
    // written only when the pool changes) was taken as said.
    need_etcd!();
    let _one_at_a_time = one_at_a_time();
    let server = etcd::Etcd::start("published");
    let proxy = etcd::Proxy::start(server.port());
    live_for(Duration::from_secs(90), async {
        let (mut cluster, direct, second) = two_replicas_one_node(&server).await;
        // The leader reaches etcd through a proxy, to be cut off.
        let mut first = direct.clone();
        first.state.etcd = vec![proxy.endpoint()];
        let mut a = Replica::start(&first).unwrap();
        let live = a.lead(None).await.unwrap();
        let mut events = live.gate.subscribe();
        cluster.spawn(0).unwrap();
        let epoch = ready(&mut events).await;
        // Beside the leader (its sockets held here), and as a follower.
        for (name, config) in [("beside the leader", &direct), ("a follower", &second)] {
            let (code, said) = until_ready_probe(&cluster, name, config, "15s").await;
            assert_eq!(
                code,
                Some(0),
                "{name}: not ready though the pool is: {said}"
            );
            assert!(
                said.contains(&format!("ready, epoch {}", epoch.0)),
                "{name}: {said}"
            );
            // Beside the leader it only reads; elsewhere it is a replica.
            let campaigned = !said.contains("it does not campaign");
            assert_eq!(campaigned, name == "a follower", "{name}: {said}");
        }
        // The leader cut off from etcd: its record says "ready" still, but
        // its lease goes unrenewed, then is gone.
        proxy.set_cut(true);
        let store = store_of(&server, &direct);
        let cut = tokio::time::Instant::now();
        while leader_lease(&store).is_some() {
            assert!(
                cut.elapsed() < Duration::from_secs(20),
                "the lease never went"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let (code, said) = until_ready_probe(&cluster, "beside a gone leader", &direct, "2s").await;
        assert_eq!(code, Some(1), "a stale ready taken as said: {said}");
        assert!(said.contains("no replica leads now"), "{said}");
        proxy.set_cut(false);
        live.stop().await;
        a.resign();
        cluster.kill(0);
    });
}

#[test]
fn a_frozen_leaders_ready_is_not_taken_when_etcds_new_raft_term_renewed_its_lease() {
    // An operator's trial: the leader's host cut off while it also held
    // etcd's raft leadership. etcd's next raft leader gave every lease a
    // fresh TTL, the frozen leader's too, which read as renewed: a probe
    // among replicas took its last "ready" for 6 s. Here etcd's one member
    // restarts (a new raft term) while the leader is cut off and a probe
    // waits; the lease reads fresh by etcd's hand alone.
    need_etcd!();
    let _one_at_a_time = one_at_a_time();
    let mut server = etcd::Etcd::start("renewed-leader");
    let proxy = etcd::Proxy::start(server.port());
    live_for(Duration::from_secs(90), async {
        let (mut cluster, mut direct, _) = two_replicas_one_node(&server).await;
        // A lease that outlives the cut and etcd's restart.
        direct.state.lease = Duration::from_secs(20);
        let mut first = direct.clone();
        first.state.etcd = vec![proxy.endpoint()];
        let mut a = Replica::start(&first).unwrap();
        let live = a.lead(None).await.unwrap();
        let mut events = live.gate.subscribe();
        cluster.spawn(0).unwrap();
        ready(&mut events).await;
        // Published ready (within a second of `PoolReady`), then cut off.
        let store = published_ready(&server, &direct).await;
        proxy.set_cut(true);
        // Unrenewed for more than three tenths of the TTL and a second:
        // stale.
        let cut = tokio::time::Instant::now();
        while leader_lease(&store).is_none_or(|(left, _)| left > Duration::from_secs(11)) {
            assert!(cut.elapsed() < Duration::from_secs(16), "never stale");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // A probe beside the leader (a reader) waits; etcd restarts once
        // it reads.
        let log = cluster.dir.join(format!("watch-{}.log", "beside".len()));
        let probe = until_ready_probe(&cluster, "beside", &direct, "6s");
        let restart = async {
            let began = tokio::time::Instant::now();
            while !std::fs::read_to_string(&log)
                .unwrap_or_default()
                .contains("it does not campaign")
            {
                assert!(began.elapsed() < Duration::from_secs(10), "no probe");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            server.restart();
            let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
            let refreshed = loop {
                if let Some((left, _)) = leader_lease(&store) {
                    break left;
                }
                assert!(tokio::time::Instant::now() < deadline, "etcd not back");
                tokio::time::sleep(Duration::from_millis(100)).await;
            };
            assert!(
                refreshed > Duration::from_secs(13),
                "etcd's new term renewed the lease: {refreshed:?} left"
            );
        };
        let ((code, said), ()) = tokio::join!(probe, restart);
        assert_eq!(code, Some(1), "a frozen leader's ready taken: {said}");
        assert!(said.contains("not seen renewing"), "{said}");
        proxy.set_cut(false);
        live.stop().await;
        a.resign();
        cluster.kill(0);
    });
}

#[test]
fn a_ready_published_by_the_leader_before_is_not_taken_once_another_leads() {
    // An operator's trial: probes waiting through a takeover took the
    // previous leader's "ready" 12-85 ms after the next leader took the
    // key, before it had published anything: its lease was renewed, the
    // record was not its own. Here the next leader has not published
    // when the probe reads (this thread, which runs its publisher, waits
    // on the probe).
    need_etcd!();
    let _one_at_a_time = one_at_a_time();
    let server = etcd::Etcd::start("previous-leader");
    live_for(Duration::from_secs(90), async {
        let (mut cluster, first, second) = two_replicas_one_node(&server).await;
        let mut a = Replica::start(&first).unwrap();
        let live = a.lead(None).await.unwrap();
        let mut events = live.gate.subscribe();
        cluster.spawn(0).unwrap();
        ready(&mut events).await;
        published_ready(&server, &first).await;
        // The first leader crashes (its lease left to expire); the second
        // takes over.
        let mut b = Replica::start(&second).unwrap();
        a.abandon();
        let next = tokio::time::timeout(Duration::from_secs(15), b.lead(None))
            .await
            .expect("the second replica leads")
            .unwrap();
        let (code, said) = until_ready_probe_blocking(&cluster, "after", &first, "2s");
        assert_eq!(code, Some(1), "the previous leader's ready taken: {said}");
        assert!(said.contains("before the one leading now"), "{said}");
        next.stop().await;
        live.stop().await;
        cluster.kill(0);
    });
}

#[test]
fn a_readiness_check_started_while_etcd_is_down_waits_for_it_within_its_timeout() {
    // An operator's trial: `watch --until-ready --timeout` started while
    // etcd elected a leader, or had no quorum, exited 2 at once
    // (`etcdserver: leader changed`, `etcd unreachable`): a deploy
    // script's readiness gate failed where it should have waited.
    need_etcd!();
    let _one_at_a_time = one_at_a_time();
    let mut server = etcd::Etcd::start("etcd-down");
    live_for(Duration::from_secs(90), async {
        let (mut cluster, mut direct, _) = two_replicas_one_node(&server).await;
        // A lease that rides through etcd's restart.
        direct.state.lease = Duration::from_secs(20);
        let mut a = Replica::start(&direct).unwrap();
        let live = a.lead(None).await.unwrap();
        let mut events = live.gate.subscribe();
        cluster.spawn(0).unwrap();
        let epoch = ready(&mut events).await;
        published_ready(&server, &direct).await;
        server.stop();
        let mut probe = Probe::spawn(&cluster, "etcd-down", &direct, "30s");
        let began = tokio::time::Instant::now();
        while !std::fs::read_to_string(&probe.log)
            .unwrap_or_default()
            .contains("etcd does not answer")
        {
            let ended = probe.ended();
            assert!(ended.is_none(), "it did not wait for etcd: {ended:?}");
            assert!(began.elapsed() < Duration::from_secs(10), "no word of etcd");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // One whose timeout comes first says so, and what etcd said.
        let (code, said) = until_ready_probe(&cluster, "short", &direct, "1s").await;
        assert_eq!(code, Some(1), "{said}");
        assert!(
            said.contains("not ready within 1s: etcd did not answer: etcd http"),
            "{said}"
        );
        // A bad setting is said at once, etcd or not (an operator's trial:
        // a missing key file waited for etcd, then out its timeout).
        let mut keyless = direct.clone();
        keyless.state.key = Some(cluster.dir.join("no-such.key"));
        let (code, said) = until_ready_probe(&cluster, "a missing key", &keyless, "20s").await;
        assert_eq!(code, Some(2), "{said}");
        assert!(
            said.contains("state.key") && !said.contains("etcd does not answer"),
            "{said}"
        );
        server.restart();
        let (code, said) = loop {
            if let Some(ended) = probe.ended() {
                break ended;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert_eq!(code, Some(0), "{said}");
        assert!(
            said.contains(&format!("ready, epoch {}", epoch.0)),
            "{said}"
        );
        live.stop().await;
        a.resign();
        cluster.kill(0);
    });
}

/// Waits (bounded) until the leader has published the pool of `config`
/// ready (within a second of its `PoolReady`); a store to read it by.
async fn published_ready(server: &etcd::Etcd, config: &Config) -> Arc<EtcdStore> {
    let store = Arc::new(store_of(server, config));
    let began = tokio::time::Instant::now();
    while poolgate::ha::requests::leader_said(Arc::clone(&store))
        .await
        .ok()
        .flatten()
        .is_none_or(|said| said["phase"] != "ready")
    {
        assert!(began.elapsed() < Duration::from_secs(10), "not published");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    store
}

/// [`until_ready_probe`], waited for on this thread: nothing else this
/// thread runs (an orchestrator started here) moves meanwhile.
fn until_ready_probe_blocking(
    cluster: &poolgate::cli::cluster::LocalCluster,
    name: &str,
    config: &Config,
    timeout: &str,
) -> (Option<i32>, String) {
    let mut probe = Probe::spawn(cluster, &format!("blocking-{name}"), config, timeout);
    loop {
        if let Some(ended) = probe.ended() {
            return ended;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `watch --until-ready --timeout timeout` with `config`, named `name`:
/// its exit code and what it said (bounded: killed after 30 s).
async fn until_ready_probe(
    cluster: &poolgate::cli::cluster::LocalCluster,
    name: &str,
    config: &Config,
    timeout: &str,
) -> (Option<i32>, String) {
    let mut probe = Probe::spawn(cluster, &name.len().to_string(), config, timeout);
    loop {
        if let Some(ended) = probe.ended() {
            return ended;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A `watch --until-ready` process, its log in the cluster's folder.
struct Probe {
    watch: std::process::Child,
    log: std::path::PathBuf,
    started: std::time::Instant,
}

impl Probe {
    fn spawn(
        cluster: &poolgate::cli::cluster::LocalCluster,
        tag: &str,
        config: &Config,
        timeout: &str,
    ) -> Probe {
        let file = cluster.dir.join(format!("watch-{tag}.toml"));
        std::fs::write(&file, poolgate::cli::cluster::orchestrator_toml(config)).unwrap();
        let log = cluster.dir.join(format!("watch-{tag}.log"));
        let watch = std::process::Command::new(env!("CARGO_BIN_EXE_poolgate"))
            .args(["watch", "--until-ready", "--timeout", timeout, "--config"])
            .arg(&file)
            .env("RUST_LOG", "info")
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        Probe {
            watch,
            log,
            started: std::time::Instant::now(),
        }
    }

    /// Its exit code (`None`: killed after 30 s) and what it said, once it
    /// has ended.
    fn ended(&mut self) -> Option<(Option<i32>, String)> {
        let code = match self.watch.try_wait().unwrap() {
            Some(status) => status.code(),
            None if self.started.elapsed() > Duration::from_secs(30) => {
                let _ = self.watch.kill();
                let _ = self.watch.wait();
                None
            }
            None => return None,
        };
        Some((code, std::fs::read_to_string(&self.log).unwrap_or_default()))
    }
}

#[test]
fn sighup_reloads_the_keys_of_run_among_replicas_and_does_not_end_it() {
    // Adversary finding: `pkill -HUP poolgate` (the operator guide's key rotation)
    // ended `poolgate run` among replicas by the signal's default action,
    // its command with it, leaving its committed run guarded for good.
    need_etcd!();
    let _one_at_a_time = one_at_a_time();
    let server = etcd::Etcd::start("hangup");
    let dir = std::env::temp_dir().join(format!("poolgate-hangup-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[pool]\nid = \"pool-a\"\nmembers = [\"node-1\"]\n[readiness]\nconvergence_window = \"50ms\"\n\
             [swim]\nbind = \"127.0.0.1:0\"\ninsecure = true\nlabel = \"hangup\"\n\
             [agents]\nlisten = \"127.0.0.1:0\"\n\
             [state]\netcd = [\"{}\"]\nlease = \"2s\"\ninsecure = true\n",
            server.endpoint
        ),
    )
    .unwrap();
    let log = dir.join("run.log");
    let mut run = std::process::Command::new(env!("CARGO_BIN_EXE_poolgate"))
        .args(["run", "--config"])
        .arg(&config)
        .args(["--timeout", "30s", "--", "true"])
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let led = line_in(&log, "this replica leads", Duration::from_secs(10));
    let pid = nix::unistd::Pid::from_raw(run.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP).unwrap();
    let reloaded = line_in(&log, "cluster keys read again", Duration::from_secs(10));
    let still = run.try_wait().unwrap();
    let _ = run.kill();
    let _ = run.wait();
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(led.is_some(), "run never led: {text}");
    assert!(reloaded.is_some(), "SIGHUP not taken as a reload: {text}");
    assert!(still.is_none(), "run ended by SIGHUP ({still:?}): {text}");
}

#[test]
fn run_end_of_a_run_whose_requester_is_gone_ends_it_and_says_so() {
    // Adversary finding: the run of a requester that is gone has no outcome
    // to read, so `run --end` ended it and said it had not (exit 4).
    need_etcd!();
    let _one_at_a_time = one_at_a_time();
    let server = etcd::Etcd::start("ghost-end");
    let config = config(&server.endpoint, "");
    live_for(Duration::from_secs(60), async {
        let mut leader = Replica::start(&config).unwrap();
        let live = leader.lead(None).await.unwrap();
        let requests = poolgate::ha::replica::requests_of(&config).unwrap();
        let node = poolgate::core::NodeId::new("node-1").unwrap();
        make_ready(&live.gate, "node-1").await;
        let ghost = poolgate::core::RunId::new("ghost").unwrap();
        let session = requests
            .ask(&ghost, std::slice::from_ref(&node), Duration::from_secs(2))
            .await
            .unwrap();
        tokio::time::timeout(Duration::from_secs(5), async {
            while live.gate.report().await.unwrap().run.as_ref() != Some(&ghost) {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await
        .expect("committed");
        drop(session);
        let code = poolgate::cli::commands::end_run(&config, None, &ghost)
            .await
            .unwrap();
        assert_eq!(live.gate.report().await.unwrap().run, None, "ended");
        assert_eq!(code, 0, "run --end said it failed though it ended the run");
        live.shutdown();
        leader.resign();
    });
}

/// Leads on `config`'s pool (node-1), with run `planning` begun and then
/// suspended (node-1 unavailable: readiness lost under `wait`), and asked
/// for through etcd as a requester does (its session of 2 s): the leader,
/// its requests client, the session, and the fleet's events from before
/// the request.
async fn a_suspended_run_asked_for(
    leader: &mut Replica,
    config: &Config,
    planning: &poolgate::core::RunId,
) -> (
    poolgate::live::Orchestrator,
    poolgate::ha::requests::Requests,
    poolgate::ha::requests::Session,
    poolgate_actors::EventStream,
) {
    let live = leader.lead(None).await.unwrap();
    let requests = poolgate::ha::replica::requests_of(config).unwrap();
    let node = poolgate::core::NodeId::new("node-1").unwrap();
    make_ready(&live.gate, "node-1").await;
    let epoch = live.gate.wait_ready().await.unwrap().epoch;
    live.gate
        .begin_planning(planning.clone(), Some(epoch))
        .await
        .unwrap();
    live.gate
        .agent(poolgate::core::AgentReport::Unavailable { node: node.clone() })
        .await
        .unwrap();
    let events = live.fleet.subscribe();
    let session = requests
        .ask(
            planning,
            std::slice::from_ref(&node),
            Duration::from_secs(2),
        )
        .await
        .unwrap();
    (live, requests, session, events)
}

/// Waits up to 10 s for `planning_aborted` of `run`; its reason.
async fn aborted(events: &mut poolgate_actors::EventStream, run: &poolgate::core::RunId) -> String {
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let event = events.recv().await.expect("the fleet's events");
            let line = serde_json::to_value(&event).unwrap();
            if line["event"] == "planning_aborted" && line["run"] == run.as_str() {
                return line["reason"].as_str().unwrap_or_default().to_string();
            }
        }
    })
    .await
    .expect("planning_aborted within 10 s")
}

#[test]
fn a_run_planning_whose_requester_gave_up_is_withdrawn_and_the_pool_serves_the_next() {
    // An operator's trial: a requester that gave up while its run planned
    // (suspended by a readiness lost under `wait`) asked its end; the
    // leader refused it ("run … is planning, not committed") and every
    // later run of the pool said "run … is active" until a takeover. A run
    // planning whose requester withdrew is now withdrawn
    // (`planning_aborted`, `withdrawn`), and the next run is committed.
    need_etcd!();
    let _one_at_a_time = one_at_a_time();
    let server = etcd::Etcd::start("withdrawn");
    let config = config(&server.endpoint, "");
    live_for(Duration::from_secs(60), async {
        let mut leader = Replica::start(&config).unwrap();
        let gave_up = poolgate::core::RunId::new("gave-up").unwrap();
        let (live, requests, session, mut events) =
            a_suspended_run_asked_for(&mut leader, &config, &gave_up).await;
        requests.withdraw(&gave_up).await.unwrap();
        drop(session);
        assert_eq!(aborted(&mut events, &gave_up).await, "withdrawn");
        assert_eq!(live.gate.report().await.unwrap().run, None);
        // The pool serves the next run.
        make_ready(&live.gate, "node-1").await;
        let next = poolgate::core::RunId::new("next").unwrap();
        let node = poolgate::core::NodeId::new("node-1").unwrap();
        let _session = requests
            .ask(&next, std::slice::from_ref(&node), Duration::from_secs(5))
            .await
            .unwrap();
        committed(requests.clone(), next).await;
        live.shutdown();
        leader.resign();
    });
}

#[test]
fn a_run_planning_whose_requester_died_is_withdrawn_once_its_session_expires() {
    // As above, the requester SIGKILLed: no end asked, its request gone
    // with its session. The leader, which saw the run asked for, withdraws
    // it once neither the request nor its requester is there.
    need_etcd!();
    let _one_at_a_time = one_at_a_time();
    let server = etcd::Etcd::start("withdrawn-dead");
    let config = config(&server.endpoint, "");
    live_for(Duration::from_secs(60), async {
        let mut leader = Replica::start(&config).unwrap();
        let died = poolgate::core::RunId::new("died").unwrap();
        let (live, requests, session, mut events) =
            a_suspended_run_asked_for(&mut leader, &config, &died).await;
        // Seen asked for while it waits: the leader says why it waits.
        let waits = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                if let Some(waits) = requests.waits(&died).await {
                    return waits;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await
        .expect("the leader says why the run waits");
        assert!(waits.contains("the pool is not ready"), "{waits}");
        drop(session);
        assert_eq!(aborted(&mut events, &died).await, "withdrawn");
        assert_eq!(live.gate.report().await.unwrap().run, None);
        live.shutdown();
        leader.resign();
    });
}

#[test]
fn a_run_whose_requester_stopped_renewing_its_session_is_not_planned_when_the_pool_is_ready() {
    // An operator's trial: a requester SIGKILLed while its run waited for
    // the pool; the pool was ready 3 s later, and the leader planned and
    // committed the run of a requester that was gone: it held its nodes,
    // guarded by nobody, until the session expired.
    need_etcd!();
    let _one_at_a_time = one_at_a_time();
    let server = etcd::Etcd::start("stale-requester");
    let config = config(&server.endpoint, "");
    live_for(Duration::from_secs(60), async {
        let mut leader = Replica::start(&config).unwrap();
        let live = leader.lead(None).await.unwrap();
        let requests = poolgate::ha::replica::requests_of(&config).unwrap();
        let mut events = live.fleet.subscribe();
        let gone = poolgate::core::RunId::new("gone").unwrap();
        // The pool is not ready (node-1 never seen); a requester asks and
        // is killed at once (its lease lives on, renewed by nobody), and
        // the pool is ready 3 s later.
        let store = store_of(&server, &config);
        asked_by_a_requester_killed_at_once(&store, &gone, Duration::from_secs(6));
        tokio::time::sleep(Duration::from_secs(3)).await;
        make_ready(&live.gate, "node-1").await;
        assert!(
            !planned_within(&mut events, &gone, Duration::from_secs(5)).await,
            "the run of a requester gone was planned"
        );
        // Its request went with its session; the pool serves the next.
        let _session = committed_for(&requests, &mut events, "next", Duration::from_secs(6)).await;
        live.shutdown();
        leader.resign();
    });
}

/// An operator's trial: a requester stopped while etcd had no quorum
/// could not withdraw its request; etcd, electing a raft leader once it
/// had one again, gave every lease a fresh TTL, its session's too, which
/// read as its requester renewing it: the leader committed its run, held
/// by nobody until the session expired. Here the requester is gone before
/// etcd's one member restarts (a new raft term): its lease reads stale,
/// then fresh by etcd's hand alone. It is not planned; a requester that
/// renews is, soon after.
#[test]
fn a_requester_gone_before_etcd_elected_anew_is_not_planned_though_etcd_renewed_its_lease() {
    need_etcd!();
    let _one_at_a_time = one_at_a_time();
    let mut cluster = etcd::Cluster::start("renewed-by-etcd", 1);
    // A lease the leader's renewals ride through etcd's restart on.
    let config = config_of(&cluster.endpoints(), "", "20s");
    let store = store_on(cluster.client(Duration::from_secs(1)), &config);
    live_for(Duration::from_secs(90), async {
        a_gone_requester_is_not_planned_after(&config, &store, async |store, lease| {
            // etcd's member restarts on its data: a new raft term, and
            // every lease a fresh TTL.
            cluster.kill(0);
            cluster.restart(0);
            let deadline = std::time::Instant::now() + Duration::from_secs(20);
            let refreshed = loop {
                if let Ok(Some((left, _))) = store.etcd().time_to_live(lease) {
                    break left;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "etcd did not answer again"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            };
            assert!(
                refreshed >= Duration::from_secs(5),
                "etcd's new term gave the lease a fresh TTL: {refreshed:?} left"
            );
        })
        .await;
    });
}

/// Another operator's trial: etcd's raft leader and another member
/// paused for 5 s, a waiting requester stopped 2 s into it; the renewals
/// it had sent the paused leader were applied as it resumed, so its
/// lease read fresh 4 s after it had gone, with no new raft term, and the
/// leader committed its run. Here the leader is cut from etcd (through a
/// proxy) while the gone requester's lease is renewed once, as such a
/// held renewal lands; once etcd answers the leader again, the requester
/// is not planned, and one that renews is.
#[test]
fn a_requester_whose_last_renewal_landed_late_is_not_planned_once_etcd_answers_again() {
    need_etcd!();
    let _one_at_a_time = one_at_a_time();
    let (server, proxy) = behind_proxy("late-renewal");
    let config = config_of(&[proxy.endpoint()], "", "20s");
    let store = store_of(&server, &config);
    live_for(Duration::from_secs(90), async {
        a_gone_requester_is_not_planned_after(&config, &store, async |store, lease| {
            // The leader's calls go unanswered for 2 s (its looks, every
            // second, among them); the gone requester's held renewal
            // lands as etcd answers again.
            proxy.set_cut(true);
            tokio::time::sleep(Duration::from_secs(2)).await;
            assert!(matches!(store.etcd().keep_alive(lease), Ok(Some(_))));
            proxy.set_cut(false);
        })
        .await;
    });
}

/// Leads on `config`; a requester asks for a run over node-1 and is gone
/// at once (its lease of 6 s, in `store`, renewed by nobody) until its
/// lease reads stale; then `doubt` (given the lease) makes etcd renew it
/// without its holder. Once the pool is ready, the run of the requester
/// gone is not planned, and one that renews is.
async fn a_gone_requester_is_not_planned_after(
    config: &Config,
    store: &EtcdStore,
    doubt: impl AsyncFnOnce(&EtcdStore, i64),
) {
    let mut leader = Replica::start(config).unwrap();
    let live = leader.lead(None).await.unwrap();
    let requests = poolgate::ha::replica::requests_of(config).unwrap();
    let mut events = live.fleet.subscribe();
    let gone = poolgate::core::RunId::new("gone").unwrap();
    let ttl = Duration::from_secs(6);
    let lease = asked_by_a_requester_killed_at_once(store, &gone, ttl);
    until_stale(store, lease).await;
    doubt(store, lease).await;
    make_ready(&live.gate, "node-1").await;
    assert!(
        !planned_within(&mut events, &gone, Duration::from_secs(8)).await,
        "the run of a requester gone was planned once etcd renewed its lease"
    );
    // A requester that renews its session is planned and committed.
    let _session = committed_for(&requests, &mut events, "next", ttl).await;
    live.shutdown();
    leader.resign();
}

#[test]
fn a_node_unregistered_in_one_term_is_live_again_in_the_next_term_on_the_warm_member() {
    // Adversary finding: term 1 unregisters node-1 on the replica's warm
    // member; term 2 knows node-1 again, but the member still dropped
    // node-1's SWIM facts: never ready. Each term's attachment now brings
    // its registry's names. (Term 2 starts from the registry the replicas
    // share, where term 1 wrote node-1 off: it registers node-1 again.)
    need_etcd!();
    let _one_at_a_time = one_at_a_time();
    let server = etcd::Etcd::start("warm-registry");
    live_for(Duration::from_secs(90), async {
        let (mut cluster, config) = one_node_cluster_on(&server).await;
        let node1 = common::node("node-1");
        let mut b = Replica::start(&config).unwrap();
        let live = b.lead(None).await.unwrap();
        assert_eq!(
            Some(live.swim_addr),
            b.swim_addr(),
            "term 1 on the warm member"
        );
        let mut events = live.gate.subscribe();
        cluster.spawn(0).unwrap();
        ready(&mut events).await;
        live.unregister(&node1).await.unwrap();
        // The term ends (its leader key gone, as when its lease lapses).
        let next = a_next_term(&server, b"/poolgate/warm/pool-w/leader", &mut b, live).await;
        assert_eq!(
            Some(next.swim_addr),
            b.swim_addr(),
            "term 2 on the warm member"
        );
        assert!(
            !next.registered().contains_key(&node1),
            "term 1's change is the shared registry's"
        );
        let mut events = next.gate.subscribe();
        next.register(node1.clone(), config.registry[&node1])
            .await
            .unwrap();
        let got = tokio::time::timeout(Duration::from_secs(15), ready(&mut events)).await;
        let words = next.gate.report().await.unwrap().candidates[0].blockers_in_words();
        next.stop().await;
        b.resign();
        cluster.kill(0);
        assert!(got.is_ok(), "term 2 never ready: {words}");
    });
}

#[test]
fn a_run_that_faults_before_the_leaders_look_still_has_its_outcome_written() {
    // CI finding (the rig's takeover test): the leader's look read the
    // gate's report after the run had faulted, found the run no longer
    // active, and forgot its request before the fault was written; the
    // requester never heard that its run faulted. Here the fault is
    // published and the look comes before the event is taken: the
    // interleaving that lost it, made deterministic.
    need_etcd!();
    let _one_at_a_time = one_at_a_time();
    let server = etcd::Etcd::start("settled");
    let store = a_term_of(&server, "settled");
    let config = config(&server.endpoint, "");
    live_for(Duration::from_secs(60), async {
        let LeaderAsked {
            gate,
            mut serving,
            requests,
            run,
            _session,
        } = leader_asked(&config, &store, Duration::from_secs(5)).await;
        // Looks until the leader committed it and wrote so.
        tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                serving.look().await.unwrap();
                serving.settle_published().await.unwrap();
                let outcome = requests.outcome(&run).await.unwrap();
                if outcome.is_some_and(|o| o.status == "committed") {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .expect("committed");
        // A required node is suspected: the run faults, and the look
        // comes before the leader takes the event.
        common::swim(&gate, "node-1", poolgate::core::SwimState::Suspect, 1).await;
        assert_eq!(gate.report().await.unwrap().run, None);
        serving.look().await.unwrap();
        let outcome = requests.outcome(&run).await.unwrap();
        assert_eq!(
            outcome.map(|o| o.status),
            Some("faulted".to_string()),
            "the requester is told its run faulted"
        );
        gate.stop();
    });
}

/// A store bound to a term of its own on `server` (a `leader` key put by
/// hand, the fence held for ten minutes): the leader's side of the
/// requests, driven by the test.
fn a_term_of(server: &etcd::Etcd, label: &str) -> Arc<EtcdStore> {
    let prefix = format!("/poolgate/{label}/pool-a/");
    let api = Arc::new(server.client());
    api.put(format!("{prefix}leader").as_bytes(), b"{}")
        .unwrap();
    let created = api
        .get(format!("{prefix}leader").as_bytes())
        .unwrap()
        .unwrap()
        .create_revision;
    let fence = Arc::new(Fence::default());
    fence.set(LeaderTerm {
        created,
        until: std::time::Instant::now() + Duration::from_secs(600),
    });
    let (store, _) = EtcdStore::new(api, &prefix, label, "pool-a", fence)
        .bind(created)
        .unwrap();
    store
}

/// The leader's side on a ready pool of node-1, asked run r1 (by a
/// requester whose session lives `ttl`), before its first look.
struct LeaderAsked {
    gate: poolgate::Gate,
    serving: poolgate::ha::requests::RequestServer,
    requests: poolgate::ha::requests::Requests,
    run: poolgate::core::RunId,
    _session: poolgate::ha::requests::Session,
}

async fn leader_asked(config: &Config, store: &Arc<EtcdStore>, ttl: Duration) -> LeaderAsked {
    let gate = poolgate::Gate::try_start(config.gate_settings().unwrap()).unwrap();
    let node = poolgate::core::NodeId::new("node-1").unwrap();
    let serving = poolgate::ha::requests::RequestServer::new(gate.clone(), Arc::clone(store));
    let requests = poolgate::ha::requests::Requests::new(Arc::clone(store));
    let run = poolgate::core::RunId::new("r1").unwrap();
    let session = requests
        .ask(&run, std::slice::from_ref(&node), ttl)
        .await
        .unwrap();
    make_ready(&gate, "node-1").await;
    gate.wait_ready().await.unwrap();
    LeaderAsked {
        gate,
        serving,
        requests,
        run,
        _session: session,
    }
}

#[test]
fn a_run_whose_planning_was_abandoned_is_never_planned_again_under_its_id() {
    // Nemesis finding (seed 112232919240855, 30 minutes): a run's planning
    // was aborted, but its request stayed in etcd, and the leader planned,
    // committed and finished the same run: two ends told for one run. Now
    // the abort is written as the run's outcome (`aborted`) and takes the
    // request; the requester asks again under a new id.
    need_etcd!();
    let _one_at_a_time = one_at_a_time();
    let server = etcd::Etcd::start("aborted");
    let store = a_term_of(&server, "aborted");
    let config = config(
        &server.endpoint,
        "[planning]\non_readiness_lost = \"abort\"\n",
    );
    live_for(Duration::from_secs(60), async {
        let LeaderAsked {
            gate,
            mut serving,
            requests,
            run,
            _session,
        } = leader_asked(&config, &store, Duration::from_secs(30)).await;
        // The leader began planning it; readiness is lost before the
        // commit, and the policy aborts the planning.
        gate.begin_planning(run.clone(), None).await.unwrap();
        common::swim(&gate, "node-1", poolgate::core::SwimState::Suspect, 1).await;
        tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                serving.settle_published().await.unwrap();
                if let Ok(Some(o)) = requests.outcome(&run).await {
                    return o;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .map(|o| assert_eq!(o.status, "aborted", "{o:?}"))
        .expect("the abort is written as the run's outcome");
        // Ready again, the leader looks: the run is not planned again.
        common::swim(&gate, "node-1", poolgate::core::SwimState::Alive, 2).await;
        gate.wait_ready().await.unwrap();
        serving.look().await.unwrap();
        assert_eq!(gate.report().await.unwrap().run, None, "planned again");
        assert_eq!(store.get_raw("requests/r1").unwrap(), None);
        gate.stop();
    });
}

#[test]
fn a_run_a_new_term_finds_planning_is_told_aborted_not_planned_again() {
    // The nemesis's interleaving: the term before began planning the run
    // and ended; the new term's gate aborts it as it starts (design §9),
    // before the requests' server subscribes. The server writes that end
    // first.
    need_etcd!();
    let _one_at_a_time = one_at_a_time();
    let server = etcd::Etcd::start("restarted");
    let store = a_term_of(&server, "restarted");
    let config = config(&server.endpoint, "");
    live_for(Duration::from_secs(60), async {
        let node = poolgate::core::NodeId::new("node-1").unwrap();
        let run = poolgate::core::RunId::new("r1").unwrap();
        let requests = poolgate::ha::requests::Requests::new(Arc::clone(&store));
        let _session = requests
            .ask(&run, std::slice::from_ref(&node), Duration::from_secs(30))
            .await
            .unwrap();
        let planning = Durable {
            last_epoch: 1,
            run: Some(poolgate::core::DurableRun {
                run: run.clone(),
                epoch: poolgate::core::Epoch(1),
                committed: false,
                required: vec![(node.clone(), None)],
            }),
        };
        store.save(&planning).unwrap();
        let settings = config
            .gate_settings()
            .unwrap()
            .with_durable(poolgate::DurableSettings {
                store: Arc::clone(&store) as Arc<dyn StateStore>,
                restored: planning,
                restore_grace: Duration::from_secs(5),
            })
            .unwrap();
        let gate = poolgate::Gate::try_start(settings).unwrap();
        let serving = actix::spawn(poolgate::ha::requests::serve_in(
            None,
            gate.clone(),
            Arc::clone(&store),
            config.pool.clone(),
            Some(run.clone()),
        ));
        let outcome = tokio::time::timeout(
            Duration::from_secs(10),
            outcome_of(&requests, &run, "aborted"),
        )
        .await
        .expect("the abort at start is written as the run's outcome");
        assert!(
            matches!(outcome.event, Some(Event::PlanningAborted { .. })),
            "{outcome:?}"
        );
        tokio::time::timeout(Duration::from_secs(10), async {
            while store.get_raw("requests/r1").unwrap().is_some() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .expect("the request taken");
        make_ready(&gate, "node-1").await;
        gate.wait_ready().await.unwrap();
        assert_eq!(gate.report().await.unwrap().run, None, "planned again");
        serving.abort();
        gate.stop();
    });
}

/// A term made by hand under `prefix` of cluster `label`, pool `pool-a`:
/// the `leader` key put, a fence holding its create revision for ten
/// minutes, and the prefix's store (unbound); the client, the fence, the
/// term and the store.
fn a_term_by_hand(
    server: &etcd::Etcd,
    prefix: &str,
    label: &str,
) -> (Arc<poolgate::ha::etcd::Etcd>, Arc<Fence>, i64, EtcdStore) {
    let api = Arc::new(server.client());
    let key = format!("{prefix}leader");
    api.put(key.as_bytes(), b"{}").unwrap();
    let created = api.get(key.as_bytes()).unwrap().unwrap().create_revision;
    let fence = Arc::new(Fence::default());
    fence.set(LeaderTerm {
        created,
        until: std::time::Instant::now() + Duration::from_secs(600),
    });
    let base = EtcdStore::new(
        Arc::clone(&api),
        prefix,
        label,
        "pool-a",
        Arc::clone(&fence),
    );
    (api, fence, created, base)
}

/// No write from the past (docs/failover.md §1): a term's write lands only on the
/// record it read (or last wrote). A record changed under the term by
/// anyone else refuses the write and ends the term, for good: renewing
/// its lease does not bring it back.
#[test]
fn a_write_against_a_record_changed_under_the_term_is_refused_and_ends_the_term() {
    need_etcd!();
    let _one_at_a_time = one_at_a_time();
    let server = etcd::Etcd::start("changed-under");
    let prefix = "/poolgate/changed/pool-a/";
    let (_, fence, created, base) = a_term_by_hand(&server, prefix, "changed");
    let (store, held) = base.bind(created).unwrap();
    assert!(held.is_none(), "a fresh prefix holds nothing");
    let state = |last_epoch| Durable {
        last_epoch,
        run: None,
    };
    store.save(&state(3)).unwrap();
    store.save(&state(4)).unwrap();
    // A second store of the same term, bound before the last write,
    // holds an older revision: its write is from the past.
    let (late, _) = base.bind(created).unwrap();
    store.save(&state(5)).unwrap();
    assert!(
        late.save(&state(4)).is_err(),
        "a write against an older record landed"
    );
    assert_eq!(base.read().unwrap().0.last_epoch, 5);
    assert_eq!(
        fence.current(),
        None,
        "the term goes on after a refused write"
    );
    fence.set(LeaderTerm {
        created,
        until: std::time::Instant::now() + Duration::from_secs(600),
    });
    assert_eq!(
        fence.current(),
        None,
        "a renewal brought an ended term back"
    );
    assert!(store.save(&state(6)).is_err(), "an ended term wrote");
    assert_eq!(base.read().unwrap().0.last_epoch, 5);
}

/// Issue 28, reproduction 8: anyone who reached etcd owned the gate (one
/// put of `finish/<run>` ended a run; `requests/evil` + `alive/evil` had an
/// outsider's run committed; a state record rewritten with its recomputed
/// hash was believed). Under `[state] key`, what does not carry the key's
/// MAC is refused and changes nothing.
#[test]
fn under_a_state_key_what_anyone_else_writes_into_etcd_changes_nothing() {
    need_etcd!();
    let _one_at_a_time = one_at_a_time();
    let server = etcd::Etcd::start("forged");
    let dir = std::env::temp_dir().join(format!("poolgate-forged-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let key = dir.join("state.key");
    poolgate::keys::ClusterKey::generate().save(&key).unwrap();
    let config = config(&server.endpoint, &format!("key = \"{}\"\n", key.display()));
    let prefix = "/poolgate/replicas/pool-a/";
    let anyone = server.client();
    live_for(Duration::from_secs(60), async {
        let mut leader = Replica::start(&config).unwrap();
        let live = leader.lead(None).await.unwrap();
        let requests = poolgate::ha::replica::requests_of(&config).unwrap();
        let node = poolgate::core::NodeId::new("node-1").unwrap();
        make_ready(&live.gate, "node-1").await;
        let run = poolgate::core::RunId::new("r1").unwrap();
        let _session = requests
            .ask(&run, std::slice::from_ref(&node), Duration::from_secs(5))
            .await
            .unwrap();
        tokio::time::timeout(
            Duration::from_secs(5),
            outcome_of(&requests, &run, "committed"),
        )
        .await
        .expect("committed");

        // A forged end, a forged outcome, an outsider's request.
        let put = |name: &str, value: &[u8]| {
            anyone
                .put(format!("{prefix}{name}").as_bytes(), value)
                .unwrap()
        };
        put("finish/r1", b"{}");
        put("runs/r1", br#"{"status":"faulted","event":null}"#);
        put("alive/evil", b"{}");
        put("requests/evil", br#"{"required":["node-1"],"lease":0}"#);
        // Looked at once (the leader watches the requests), and then
        // some: nothing of it was believed.
        tokio::time::sleep(poolgate::ha::requests::LEADER_LOOK_EVERY * 2).await;
        assert_eq!(live.gate.report().await.unwrap().run, Some(run.clone()));
        assert_eq!(
            requests.outcome(&run).await.unwrap().map(|o| o.status),
            None,
            "a forged outcome was read"
        );

        // The real end, then the outsider's request is still not served.
        requests.finish(&run).await.unwrap();
        tokio::time::timeout(Duration::from_secs(5), async {
            while live.gate.report().await.unwrap().run.is_some() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await
        .expect("the requester's own end is taken");
        tokio::time::sleep(poolgate::ha::requests::LEADER_LOOK_EVERY * 2).await;
        assert_eq!(
            live.gate.report().await.unwrap().run,
            None,
            "an outsider's run was committed"
        );

        // A state record rewritten with its recomputed hash is refused by
        // the next replica, naming the key.
        let forged = br#"{"last_epoch":0,"run":null}"#;
        put("state", forged);
        put("state.sha256", &sha2_of(forged));
        let refused = Replica::start(&config).map(drop).unwrap_err().to_string();
        assert!(
            refused.contains("[state] key") && refused.contains("state"),
            "{refused}"
        );
        live.stop().await;
        leader.resign();
    });
    let _ = std::fs::remove_dir_all(&dir);
}

fn sha2_of(bytes: &[u8]) -> Vec<u8> {
    use sha2::Digest;
    sha2::Sha256::digest(bytes).to_vec()
}

/// Issue 28, reproduction 5: with the 2 s lease (1.33 s to renew, shorter
/// than an etcd election), killing etcd's raft leader or a member
/// rejoining forced a takeover and 5 s of not ready. On the default lease
/// neither moves poolgate's leadership nor costs readiness
/// (docs/failover.md §5). CI saw the leadership move in round 0 twice,
/// its cause unknown then: the test now says why a leader stepped down.
#[test]
fn etcds_own_elections_move_neither_our_leader_nor_readiness_on_the_default_lease() {
    need_etcd!();
    let _one_at_a_time = one_at_a_time();
    let mut cluster = etcd::Cluster::start("elections", 3);
    let endpoints = cluster.endpoints();
    let lease = format!("{}s", poolgate::config::DEFAULT_LEASE.as_secs());
    let config = config_of(&endpoints, "", &lease);
    let raft_leader = |endpoints: &[String]| {
        (0..endpoints.len()).find(|i| {
            poolgate::ha::etcd::Etcd::new(&endpoints[*i..=*i], Duration::from_millis(500))
                .ok()
                .and_then(|one| one.member_is_leader().ok())
                .unwrap_or(false)
        })
    };
    // Three rounds in CI; `ELECTION_ROUNDS=20` for the figure in
    // BENCHMARKS.md.
    let rounds: usize = std::env::var("ELECTION_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(3);
    live_for(Duration::from_secs(60 + 40 * rounds as u64), async {
        let mut a = Replica::start(&config).unwrap();
        let mut b = Replica::start(&config).unwrap();
        let (a_leads, live) = first_leader(&mut a, &mut b).await;
        let (leader, other) = if a_leads {
            (&mut a, &mut b)
        } else {
            (&mut b, &mut a)
        };
        let mut events = live.gate.subscribe();
        make_ready(&live.gate, "node-1").await;
        ready(&mut events).await;
        // A requester's session on the default `unguarded_after` (10 s):
        // etcd's elections must not put it at risk either (an operator's
        // trial: renewing every third of the TTL, 4 of 15 runs stopped
        // with exit 5 when etcd's leader was killed).
        let requests = poolgate::ha::replica::requests_of(&config).unwrap();
        let session = requests
            .ask(
                &poolgate::core::RunId::new("through-elections").unwrap(),
                &[poolgate::core::NodeId::new("node-1").unwrap()],
                poolgate::config::DEFAULT_UNGUARDED_AFTER,
            )
            .await
            .unwrap();
        let at_risk_within = |span: Duration| {
            let session = &session;
            async move {
                let deadline = std::time::Instant::now() + span;
                while std::time::Instant::now() < deadline {
                    if let Some(unrenewed) = session.at_risk() {
                        return Some(unrenewed);
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                None
            }
        };
        for round in 0..rounds {
            let killed = tokio::time::timeout(Duration::from_secs(10), async {
                loop {
                    let endpoints = endpoints.clone();
                    let found = tokio::task::spawn_blocking(move || raft_leader(&endpoints))
                        .await
                        .unwrap();
                    if let Some(found) = found {
                        return found;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            })
            .await
            .expect("etcd has a raft leader");
            cluster.kill(killed);
            // Through etcd's election, then the member rejoining.
            let risked = at_risk_within(Duration::from_secs(3)).await;
            assert_eq!(
                risked, None,
                "round {round}: the requester's session at risk"
            );
            // Until past the renew deadline of the last renewal before
            // the kill (two thirds of the TTL).
            let kept = tokio::time::timeout(Duration::from_secs(5), leader.lost()).await;
            assert!(
                kept.is_err(),
                "round {round}: killing etcd's leader moved poolgate's leadership: stepped down for {:?} (None: its renew deadline passed unrenewed)",
                leader.stepped_down()
            );
            cluster.restart(killed);
            let kept = tokio::time::timeout(Duration::from_secs(4), leader.lost()).await;
            assert!(
                kept.is_err(),
                "round {round}: a member rejoining moved poolgate's leadership: stepped down for {:?} (None: its renew deadline passed unrenewed)",
                leader.stepped_down()
            );
            assert!(leader.leads() && !other.leads(), "round {round}");
            let lost: Vec<Event> = std::iter::from_fn(|| events.try_recv().ok())
                .filter(|e| matches!(e, Event::ReadinessLost { .. }))
                .collect();
            assert!(lost.is_empty(), "round {round}: readiness lost: {lost:?}");
        }
        live.shutdown();
        a.resign();
        b.resign();
    });
}

/// One unauthenticated call of etcd's JSON gateway, for setting auth up;
/// etcd's answer.
fn gateway(endpoint: &str, path: &str, body: serde_json::Value) -> String {
    use std::io::{Read, Write};
    let authority = endpoint.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(authority).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let body = body.to_string();
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nHost: {authority}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer
}

/// `[state] username` and `password_file`: etcd's own auth. With auth
/// enabled on etcd, a replica without the user (or with a wrong
/// password) is refused at start; with it, it leads and stores epochs.
#[test]
fn with_etcds_auth_a_replica_leads_as_its_user_and_without_it_is_refused() {
    use base64::Engine as _;
    need_etcd!();
    let _one_at_a_time = one_at_a_time();
    let server = etcd::Etcd::start("auth");
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let call = |path: &str, body: serde_json::Value| {
        let answer = gateway(&server.endpoint, path, body);
        assert!(answer.starts_with("HTTP/1.1 200"), "{path}: {answer}");
    };
    call("/v3/auth/role/add", serde_json::json!({"name": "root"}));
    call(
        "/v3/auth/user/add",
        serde_json::json!({"name": "root", "password": "root-pw"}),
    );
    call(
        "/v3/auth/user/grant",
        serde_json::json!({"user": "root", "role": "root"}),
    );
    call("/v3/auth/role/add", serde_json::json!({"name": "gate"}));
    call(
        "/v3/auth/role/grant",
        serde_json::json!({"name": "gate", "perm": {
            "permType": "READWRITE", "key": b64("/poolgate/"), "range_end": b64("/poolgate0")
        }}),
    );
    call(
        "/v3/auth/user/add",
        serde_json::json!({"name": "gate", "password": "s3cret"}),
    );
    call(
        "/v3/auth/user/grant",
        serde_json::json!({"user": "gate", "role": "gate"}),
    );
    call("/v3/auth/enable", serde_json::json!({}));

    let dir = std::env::temp_dir().join(format!("poolgate-auth-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let right = dir.join("right.pw");
    let wrong = dir.join("wrong.pw");
    std::fs::write(&right, "s3cret\n").unwrap();
    std::fs::write(&wrong, "guess\n").unwrap();
    let with = |file: &std::path::Path| {
        config(
            &server.endpoint,
            &format!(
                "username = \"gate\"\npassword_file = \"{}\"\n",
                file.display()
            ),
        )
    };
    let refused = Replica::start(&config(&server.endpoint, ""))
        .map(drop)
        .unwrap_err()
        .to_string();
    assert!(refused.contains(&server.endpoint), "{refused}");
    let refused = Replica::start(&with(&wrong))
        .map(drop)
        .unwrap_err()
        .to_string();
    assert!(refused.contains("authentication failed"), "{refused}");
    live_for(Duration::from_secs(60), async {
        let mut replica = Replica::start(&with(&right)).unwrap();
        let live = replica.lead(None).await.unwrap();
        let mut events = live.gate.subscribe();
        make_ready(&live.gate, "node-1").await;
        let epoch = ready(&mut events).await;
        assert!(epoch.0 >= 1);
        live.stop().await;
        replica.resign();
    });
    let _ = std::fs::remove_dir_all(&dir);
}

/// A replica's config over the TLS etcd at `endpoint`, as an operator
/// writes it: no `insecure`, a state key, and `tls` (the `ca_file`,
/// `cert_file` and `key_file` lines, or none).
fn tls_config(endpoint: &str, key: &std::path::Path, tls: &str) -> Config {
    Config::parse(
        &format!(
            "[pool]\nid = \"pool-a\"\nmembers = [\"node-1\"]\n[readiness]\nconvergence_window = \"50ms\"\n\
             [swim]\nbind = \"127.0.0.1:0\"\ninsecure = true\nlabel = \"replicas\"\n\
             [agents]\nlisten = \"127.0.0.1:0\"\n\
             [state]\netcd = [\"{endpoint}\"]\nlease = \"2s\"\nkey = \"{}\"\n{tls}",
            key.display()
        ),
        "config.toml",
    )
    .expect("config")
}

#[test]
fn over_tls_with_a_client_certificate_a_replica_leads_and_anything_less_is_refused() {
    need_etcd!();
    if let Some(why) = etcd::openssl_missing() {
        eprintln!("skipped: {why}");
        return;
    }
    let _one_at_a_time = one_at_a_time();
    let certs = etcd::Certs::make("tls");
    let rogue = etcd::Certs::make("tls-rogue");
    let server = etcd::Etcd::start_tls("tls", &certs);
    assert!(server.endpoint.starts_with("https://"));
    let key = certs.dir.join("state.key");
    poolgate::keys::ClusterKey::generate().save(&key).unwrap();
    let files = |ca: &etcd::Certs, client: &etcd::Certs| {
        format!(
            "ca_file = \"{}\"\ncert_file = \"{}\"\nkey_file = \"{}\"\n",
            ca.dir.join("ca.pem").display(),
            client.dir.join("client.pem").display(),
            client.dir.join("client.key").display()
        )
    };
    let refused = |config: &Config| {
        Replica::start(config)
            .map(drop)
            .expect_err("refused")
            .to_string()
    };

    // No client certificate: etcd refuses the handshake.
    let ca_only = format!("ca_file = \"{}\"\n", certs.dir.join("ca.pem").display());
    let why = refused(&tls_config(&server.endpoint, &key, &ca_only));
    assert!(why.contains(&server.endpoint), "{why}");
    // A server certificate signed by a CA we do not trust.
    let why = refused(&tls_config(&server.endpoint, &key, &files(&rogue, &certs)));
    assert!(
        why.contains(&server.endpoint) && why.to_lowercase().contains("cert"),
        "{why}"
    );
    // A client certificate signed by a CA etcd does not trust.
    let why = refused(&tls_config(&server.endpoint, &key, &files(&certs, &rogue)));
    assert!(why.contains(&server.endpoint), "{why}");
    // Plain http to the TLS port is refused at start, by name.
    let plain = server.endpoint.replace("https://", "http://");
    let error = Config::parse(
        &format!("[pool]\nid = \"p\"\nmembers = [\"n\"]\n[readiness]\nconvergence_window = \"1s\"\n[state]\netcd = [\"{plain}\"]\nkey = \"k\"\n"),
        "config.toml",
    )
    .map(drop)
    .unwrap_err()
    .to_string();
    assert!(error.contains("plain http is refused"), "{error}");

    // The whole of it: the replica leads, its state written over TLS.
    let config = tls_config(&server.endpoint, &key, &files(&certs, &certs));
    live_for(Duration::from_secs(60), async {
        let mut replica = Replica::start(&config).unwrap();
        let live = replica.lead(None).await.unwrap();
        let mut events = live.gate.subscribe();
        make_ready(&live.gate, "node-1").await;
        let epoch = ready(&mut events).await;
        assert!(epoch.0 >= 1);
        live.stop().await;
        replica.resign();
    });
    let stored = server
        .client()
        .with_tls(&certs.client())
        .unwrap()
        .get(b"/poolgate/replicas/pool-a/state")
        .unwrap();
    assert!(stored.is_some(), "the state was written through TLS");
}

#[test]
fn a_new_term_faults_nobody_for_what_its_warm_member_saw_before_it_led() {
    // Issue 28, reproduction 4: a replica that regains leadership acted
    // first on what its warm SWIM member held from before: a node it held
    // down while nobody led, alive again, faulted the restored run with
    // reason `dead`. A term starts from a fresh view: the node held down
    // is told to it only once alive again, and the run is confirmed.
    need_etcd!();
    let _one_at_a_time = one_at_a_time();
    let server = etcd::Etcd::start("fresh");
    live_for(Duration::from_secs(90), async {
        let (mut cluster, mut first, mut second) = two_replicas_one_node(&server).await;
        first.state.restore_grace = Duration::from_secs(20);
        second.state.restore_grace = Duration::from_secs(20);

        let mut a = Replica::start(&first).unwrap();
        let live = a.lead(None).await.unwrap();
        let mut events = live.gate.subscribe();
        let mut b = Replica::start(&second).unwrap();
        b.warm_up().await.unwrap();
        cluster.spawn(0).unwrap();
        let epoch = ready(&mut events).await;
        let run = poolgate::core::RunId::new("r1").unwrap();
        let node = poolgate::core::NodeId::new("node-1").unwrap();
        live.gate
            .begin_planning(run.clone(), Some(epoch))
            .await
            .unwrap();
        live.gate
            .commit_plan(run.clone(), vec![node.clone()], Some(epoch))
            .await
            .unwrap();
        let knows = |want: usize| {
            let b = &b;
            async move {
                tokio::time::timeout(Duration::from_secs(20), async {
                    while b.swim_members().await.unwrap_or(0) != want {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                })
                .await
                .is_ok()
            }
        };
        assert!(knows(2).await, "the follower never learnt node-1");
        // Nobody leads while node-1 is paused past its suspicion. b's warm
        // member accuses nobody (design §15: it has no frames to judge by),
        // so it does not hold node-1 down: what it held before a term can
        // no longer come from its own probes while nobody led. (It once
        // did, and the new term faulted the run `dead` for it.)
        live.shutdown();
        a.resign();
        cluster.signal(0, nix::sys::signal::Signal::SIGSTOP);
        let held_down = tokio::time::timeout(Duration::from_secs(5), async {
            while b.swim_members().await.unwrap_or(0) == 2 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        assert!(
            held_down.is_err(),
            "the follower's member accused node-1 while nobody led"
        );

        let next = tokio::time::timeout(Duration::from_secs(10), b.lead(None))
            .await
            .expect("b leads")
            .unwrap();
        let mut events = next.gate.subscribe();
        cluster.signal(0, nix::sys::signal::Signal::SIGCONT);
        let seen = tokio::time::timeout(Duration::from_secs(15), async {
            let mut seen = Vec::new();
            loop {
                let event = events.recv().await.expect("the term's events");
                let done = matches!(event, Event::PoolReady { .. } | Event::RunFaulted { .. });
                seen.push(event);
                if done {
                    return seen;
                }
            }
        })
        .await
        .expect("node-1 back, or the run faulted");
        assert!(
            matches!(seen.last(), Some(Event::PoolReady { .. })),
            "the new term faulted for what its member saw before it led: {seen:?}"
        );
        assert_eq!(next.gate.report().await.unwrap().run, Some(run));
        next.stop().await;
        b.resign();
        cluster.kill(0);
    });
}

#[test]
fn a_node_restarted_under_a_new_leader_is_not_fought_by_the_deposed_leaders_member() {
    // Issue 28, reproduction 7 (the rejoin storm): a leader's SWIM member,
    // detached when its term ended, kept deciding address conflicts by
    // the identities its last term's nodes had signed. A node restarted
    // later (a new generation at its address) lost every conflict at that
    // member, renewed its identity, lost again: thousands of renewals,
    // and the pool not ready under the new leader until the ex-leader was
    // restarted.
    need_etcd!();
    let _one_at_a_time = one_at_a_time();
    let server = etcd::Etcd::start("storm");
    live_for(Duration::from_secs(90), async {
        let (mut cluster, first, second) = two_replicas_one_node(&server).await;

        // a reaches etcd through a proxy the test cuts.
        let proxy = etcd::Proxy::start(server.port());
        let mut first = first;
        first.state.etcd = vec![proxy.endpoint()];
        let mut a = Replica::start(&first).unwrap();
        let live = a.lead(None).await.unwrap();
        let mut events = live.gate.subscribe();
        let mut b = Replica::start(&second).unwrap();
        b.warm_up().await.unwrap();
        cluster.spawn(0).unwrap();
        ready(&mut events).await;
        // a is cut from etcd until deposed, and follows on, its member
        // warm; b leads.
        proxy.set_cut(true);
        tokio::time::timeout(Duration::from_secs(10), async {
            while a.leads() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .expect("a is deposed");
        live.shutdown();
        let next = tokio::time::timeout(Duration::from_secs(10), b.lead(None))
            .await
            .expect("b leads")
            .unwrap();
        proxy.set_cut(false);
        let mut events = next.gate.subscribe();
        ready(&mut events).await;
        // node-1 restarts: a new generation at the same address.
        cluster.kill(0);
        cluster.spawn(0).unwrap();
        let back = tokio::time::timeout(Duration::from_secs(20), ready(&mut events)).await;
        // Then five seconds of the pool as it is, both members warm.
        let lost = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                if let Event::ReadinessLost { .. } = events.recv().await.expect("events") {
                    return;
                }
            }
        })
        .await;
        let log = std::fs::read_to_string(cluster.dir.join("node-1.log")).unwrap_or_default();
        let renewals = log.matches("rejoined under a renewed identity").count();
        eprintln!("node-1 renewed its identity {renewals} times");
        assert!(
            back.is_ok() && lost.is_err(),
            "node-1 not ready and staying so under the new leader ({renewals} renewals in its log)"
        );
        assert!(renewals <= 2, "{renewals} renewals of node-1's identity");
        next.stop().await;
        b.resign();
        a.resign();
        cluster.kill(0);
    });
}

#[test]
fn a_watch_tells_of_a_change_under_its_range_and_of_nothing_outside_it() {
    // The leader looks at the run requests when etcd tells it they
    // changed (and once a second besides), not ten times a second.
    need_etcd!();
    let _one_at_a_time = one_at_a_time();
    let server = etcd::Etcd::start("watch");
    let client = std::sync::Arc::new(server.client());
    let (told, seen) = std::sync::mpsc::channel();
    let watching = {
        let client = std::sync::Arc::clone(&client);
        std::thread::spawn(move || {
            client.watch_range(b"w/", b"w0", Duration::from_secs(4), || {
                let _ = told.send(());
            })
        })
    };
    // Outside the range: nothing told, whatever the timing.
    client.put(b"x/1", b"outside").unwrap();
    client.put(b"w0", b"just past the range").unwrap();
    // Inside: told, once the watch stands (put again until it is).
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    let mut puts = 0;
    let told_in_time = loop {
        client.put(b"w/1", format!("{puts}").as_bytes()).unwrap();
        puts += 1;
        if seen.recv_timeout(Duration::from_millis(100)).is_ok() {
            break true;
        }
        if std::time::Instant::now() > deadline {
            break false;
        }
    };
    assert!(told_in_time, "no change told in 3 s ({puts} puts)");
    let _ = seen.try_iter().count();
    // With the watch standing, changes outside its range tell nothing.
    client.put(b"x/2", b"outside").unwrap();
    client.put(b"w0", b"just past the range, again").unwrap();
    client.delete(b"x/1").unwrap();
    // The span ends the watch well.
    assert!(watching.join().unwrap().is_ok());
    assert_eq!(seen.try_iter().count(), 0, "told of keys outside the range");
}

#[test]
fn several_pools_among_replicas_each_keep_their_runs_and_epochs_across_a_takeover() {
    // design §14 among replicas (§12): one leader gates every pool; each
    // pool's requests, runs and epochs live under its own prefix; a
    // takeover restores each pool's committed run and issues each pool's
    // epochs above what it stored.
    need_etcd!();
    let _one_at_a_time = one_at_a_time();
    let server = etcd::Etcd::start("fleet");
    let text = format!(
        "[pools.a]\nmembers = [\"node-1\"]\n[pools.b]\nmembers = [\"node-2\"]\n\
         [readiness]\nconvergence_window = \"50ms\"\n\
         [swim]\nbind = \"127.0.0.1:0\"\ninsecure = true\nlabel = \"fleet\"\n\
         [agents]\nlisten = \"127.0.0.1:0\"\n\
         [state]\netcd = [\"{}\"]\nlease = \"2s\"\ninsecure = true\n",
        server.endpoint
    );
    let config = Config::parse(&text, "config.toml").expect("config");
    let pool = |id: &str| poolgate::core::PoolId::new(id).unwrap();
    let node = |id: &str| poolgate::core::NodeId::new(id).unwrap();
    live_for(Duration::from_secs(90), async {
        let mut a = Replica::start(&config).unwrap();
        let mut b = Replica::start(&config).unwrap();
        let (a_leads, live) = first_leader(&mut a, &mut b).await;
        assert_eq!(live.fleet.pools(), vec![pool("a"), pool("b")]);
        // A requester of each pool, as `run --pool` would ask.
        let of = |id: &str| {
            poolgate::ha::replica::requests_of(&config.with_only_pool(Some(id)).unwrap()).unwrap()
        };
        let (asks_a, asks_b) = (of("a"), of("b"));
        let (ra, rb) = (
            poolgate::core::RunId::new("ra").unwrap(),
            poolgate::core::RunId::new("rb").unwrap(),
        );
        let _sa = asks_a
            .ask_of(
                Some(&pool("a")),
                &ra,
                &[node("node-1")],
                Duration::from_secs(5),
            )
            .await
            .unwrap();
        let _sb = asks_b
            .ask_of(
                Some(&pool("b")),
                &rb,
                &[node("node-2")],
                Duration::from_secs(5),
            )
            .await
            .unwrap();
        for n in ["node-1", "node-2"] {
            poolgate_actors::testing::make_ready_in(&live.fleet, &node(n), b"key")
                .await
                .unwrap();
        }
        let epoch_of = |o: poolgate::ha::requests::RunOutcome| match o.event {
            Some(Event::RunCommitted { epoch, pool: p, .. }) => (p, epoch),
            other => panic!("not a commit: {other:?}"),
        };
        let within = Duration::from_secs(10);
        let (pa, ea) = epoch_of(
            tokio::time::timeout(within, committed(asks_a.clone(), ra.clone()))
                .await
                .expect("pool a's run committed"),
        );
        let (pb, eb) = epoch_of(
            tokio::time::timeout(within, committed(asks_b.clone(), rb.clone()))
                .await
                .expect("pool b's run committed"),
        );
        assert_eq!((pa, pb), (pool("a"), pool("b")));
        // Each pool's state is its own record, under pools/<id>/ of the
        // replicas' prefix (the first pool's default one).
        let prefix = EtcdStore::new(
            Arc::new(server.client()),
            "/poolgate/fleet/a/",
            "fleet",
            "",
            Arc::new(Fence::default()),
        );
        for (id, run, epoch) in [("a", &ra, ea), ("b", &rb, eb)] {
            let (held, _) = prefix.for_pool(id).read().unwrap();
            assert_eq!(held.last_epoch, epoch.0, "pool {id}");
            assert_eq!(held.run.map(|r| r.run), Some(run.clone()), "pool {id}");
        }
        let gate_of =
            |live: &poolgate::live::Orchestrator, id: &str| live.fleet.pool(&pool(id)).unwrap();
        assert_eq!(
            gate_of(&live, "a").report().await.unwrap().run,
            Some(ra.clone())
        );
        assert_eq!(
            gate_of(&live, "b").report().await.unwrap().run,
            Some(rb.clone())
        );

        // A follower answers status for every pool, from what the leader
        // published of each (found by an operator's trial: it answered
        // the first pool alone, whatever --pool asked).
        let mut watcher = config.clone();
        watcher.agents.listen = std::net::SocketAddr::from(([127, 0, 0, 1], etcd::free_port()));
        let follower_addr = watcher.agents.listen;
        let mut follower = Replica::start(&watcher).unwrap();
        let following = actix::spawn(async move {
            let _ = follower.lead(None).await;
        });
        let ask = |only: Option<&'static str>| async move {
            let mut seen = None;
            let answered = tokio::time::timeout(Duration::from_secs(10), async {
                loop {
                    if let Ok(answer) = poolgate::live::status::ask_pool(follower_addr, only).await
                    {
                        let last = answer["pools"]
                            .as_array()
                            .and_then(|p| p.last())
                            .unwrap_or(&answer);
                        if !last["leader_said"]["run"].is_null() {
                            return answer;
                        }
                        seen = Some(answer);
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            })
            .await;
            answered.unwrap_or_else(|_| panic!("the follower answers: {seen:?}"))
        };
        let every = ask(None).await;
        let pools: Vec<&str> = every["pools"]
            .as_array()
            .unwrap_or_else(|| panic!("no pools: {every}"))
            .iter()
            .map(|p| p["pool"].as_str().unwrap())
            .collect();
        assert_eq!(pools, ["a", "b"], "{every}");
        let of_b = ask(Some("b")).await;
        assert_eq!(
            (
                of_b["pool"].as_str(),
                of_b["phase"].as_str(),
                of_b["run"].as_str()
            ),
            (Some("b"), Some("following"), Some("rb")),
            "{of_b}"
        );
        assert_eq!(of_b["leader_said"]["pool"], "b", "{of_b}");
        // A pool there is not: an error naming those there are.
        let unknown = poolgate::live::status::ask_pool(follower_addr, Some("zz"))
            .await
            .expect_err("no pool zz");
        assert!(
            unknown.contains("no pool zz") && unknown.contains("a, b"),
            "{unknown}"
        );
        following.abort();

        // The leader goes; the other takes over both pools' runs.
        live.shutdown();
        let (mut next, gone) = if a_leads { (b, a) } else { (a, b) };
        gone.resign();
        let live = tokio::time::timeout(Duration::from_secs(10), next.lead(None))
            .await
            .expect("the other replica leads")
            .unwrap();
        assert_eq!(
            gate_of(&live, "a").report().await.unwrap().run,
            Some(ra.clone())
        );
        assert_eq!(
            gate_of(&live, "b").report().await.unwrap().run,
            Some(rb.clone())
        );
        // Each pool's requester ends its run; each pool's next epoch is
        // above the one it stored.
        asks_a.finish(&ra).await.unwrap();
        asks_b.finish(&rb).await.unwrap();
        let mut streams: Vec<_> = [("a", ea), ("b", eb)]
            .into_iter()
            .map(|(id, stored)| (id, stored, gate_of(&live, id).subscribe()))
            .collect();
        for n in ["node-1", "node-2"] {
            poolgate_actors::testing::make_ready_in(&live.fleet, &node(n), b"key")
                .await
                .unwrap();
        }
        for (id, stored, events) in &mut streams {
            let next_epoch = tokio::time::timeout(within, ready(events))
                .await
                .unwrap_or_else(|_| panic!("pool {id} not ready again"));
            assert!(
                next_epoch > *stored,
                "pool {id}: epoch {next_epoch:?} after {stored:?}"
            );
        }
        live.shutdown();
        next.resign();
    });
}

#[test]
fn a_write_of_this_term_that_landed_though_its_answer_was_lost_is_its_own_not_a_change() {
    // Found by an operator's trial: during etcd's election a write timed
    // out on one endpoint after etcd applied it; tried on the next, its
    // revision check failed and the leader stepped down as if someone had
    // changed the record under it.
    need_etcd!();
    let _one_at_a_time = one_at_a_time();
    let server = etcd::Etcd::start("landed");
    let prefix = "/poolgate/landed/pool-a/";
    let (client, fence, term, base) = a_term_by_hand(&server, prefix, "landed");
    let (store, _) = base.bind(term).unwrap();
    let state = Durable {
        last_epoch: 3,
        run: None,
    };
    store.save(&state).unwrap();
    // The same bytes land again under the record, as a lost answer's
    // write would have: the term's next write of them is its own.
    let key = format!("{prefix}state");
    let written = client.get(key.as_bytes()).unwrap().unwrap().value;
    client.put(key.as_bytes(), &written).unwrap();
    store
        .save(&state)
        .expect("the term's own write is no change under it");
    assert!(fence.current().is_some(), "the term goes on");
    let next = Durable {
        last_epoch: 4,
        run: None,
    };
    store.save(&next).expect("and it writes on from there");
    // Other bytes under the record are a change under the term: refused,
    // and the term ends.
    client
        .put(key.as_bytes(), b"changed by someone else")
        .unwrap();
    assert!(store
        .save(&Durable {
            last_epoch: 5,
            run: None
        })
        .is_err());
    assert!(fence.current().is_none(), "the term ends");
}

#[test]
fn a_one_pool_deployment_grows_pools_with_its_epochs_as_their_floor_once_its_run_is_ended() {
    // Found by an operator's trial: the prefix of `[pool] id = "pool-a"`
    // was refused as another cluster's once the config defined
    // `[pools.pool-a]` and `[pools.pool-b]`, so the upgrade the design
    // describes could not happen at all.
    need_etcd!();
    let _one_at_a_time = one_at_a_time();
    let server = etcd::Etcd::start("grows");
    let one = config(&server.endpoint, "");
    let text = format!(
        "[pools.pool-a]\nmembers = [\"node-1\"]\n[pools.pool-b]\nmembers = [\"node-2\"]\n\
         [readiness]\nconvergence_window = \"50ms\"\n\
         [swim]\nbind = \"127.0.0.1:0\"\ninsecure = true\nlabel = \"replicas\"\n\
         [agents]\nlisten = \"127.0.0.1:0\"\n\
         [state]\netcd = [\"{}\"]\nlease = \"2s\"\ninsecure = true\n",
        server.endpoint
    );
    let pools = Config::parse(&text, "config.toml").expect("config");
    // A third pool, added later by a reload of the leader.
    let grown = Config::parse(
        &text.replacen(
            "[readiness]",
            "[pools.pool-c]\nmembers = [\"node-1\"]\n[readiness]",
            1,
        ),
        "config.toml",
    )
    .expect("config");
    let pool = |id: &str| poolgate::core::PoolId::new(id).unwrap();
    live_for(Duration::from_secs(60), async {
        // One pool, a run committed on it.
        let mut replica = Replica::start(&one).unwrap();
        let live = replica.lead(None).await.unwrap();
        let mut events = live.gate.subscribe();
        make_ready(&live.gate, "node-1").await;
        let epoch = ready(&mut events).await;
        let run = poolgate::core::RunId::new("one-pool-run").unwrap();
        live.gate
            .begin_planning(run.clone(), Some(epoch))
            .await
            .unwrap();
        live.gate
            .commit_plan(
                run.clone(),
                vec![poolgate::core::NodeId::new("node-1").unwrap()],
                Some(epoch),
            )
            .await
            .unwrap();
        live.shutdown();
        replica.resign();
        // With pools, the run still held is named, with what ends it.
        let mut replica = Replica::start(&pools).unwrap();
        let refused = match replica.lead(None).await {
            Ok(_) => panic!("led over a one-pool run"),
            Err(e) => e.to_string(),
        };
        assert!(
            refused.contains("one-pool-run") && refused.contains("run --end"),
            "{refused}"
        );
        replica.resign();
        // Ended with the one-pool configuration ...
        let mut replica = Replica::start(&one).unwrap();
        let live = replica.lead(None).await.unwrap();
        live.gate.finish_run(run.clone()).await.unwrap();
        let mut events = live.gate.subscribe();
        make_ready(&live.gate, "node-1").await;
        let last = ready(&mut events).await;
        live.shutdown();
        replica.resign();
        // ... the pools start above the one pool's epochs.
        let mut replica = Replica::start(&pools).unwrap();
        let live = replica.lead(None).await.unwrap();
        let mut streams: Vec<_> = ["pool-a", "pool-b"]
            .into_iter()
            .map(|id| (id, live.fleet.pool(&pool(id)).unwrap().subscribe()))
            .collect();
        for n in ["node-1", "node-2"] {
            poolgate_actors::testing::make_ready_in(
                &live.fleet,
                &poolgate::core::NodeId::new(n).unwrap(),
                b"key",
            )
            .await
            .unwrap();
        }
        for (id, events) in &mut streams {
            let first = tokio::time::timeout(Duration::from_secs(10), ready(events))
                .await
                .unwrap_or_else(|_| panic!("{id} not ready"));
            assert!(
                first > last,
                "{id}: epoch {first:?}, the one pool told {last:?}"
            );
        }
        // A pool a reload adds starts above them too (an operator's
        // trial: it started at epoch 1, told again).
        let said = live.reload(&grown).await.unwrap();
        assert!(
            said.iter().any(|s| s.starts_with("pool pool-c: defined")),
            "{said:?}"
        );
        let gate = live.fleet.pool(&pool("pool-c")).unwrap();
        let mut events = gate.subscribe();
        make_ready(&gate, "node-1").await;
        let first = tokio::time::timeout(Duration::from_secs(10), ready(&mut events))
            .await
            .expect("pool-c ready");
        assert!(
            first > last,
            "pool-c: epoch {first:?}, the one pool told {last:?}"
        );
        live.shutdown();
        replica.resign();
    });
}

/// Issue 32: among replicas the registry is the one the replicas share
/// in etcd, not each replica's own file. Before, a node registered on the
/// leader (by a reload or the API) was gone at the next term, on another
/// replica or on the same one, and a replica whose file named another
/// node led with its own registry. Now a change of the registry is
/// written under the term before it applies, and every term starts from
/// what is written (a replica's file counts only while nothing is).
#[test]
fn the_registry_among_replicas_is_the_shared_one_whatever_each_replicas_file_says() {
    need_etcd!();
    let _one_at_a_time = one_at_a_time();
    let server = etcd::Etcd::start("shared-registry");
    let key = || poolgate::keys::NodeKey::generate().public();
    let (key1, key2, key3) = (key(), key(), key());
    let registry = |entries: &[(&str, &poolgate::keys::PublicKey)]| {
        let lines: Vec<String> = entries
            .iter()
            .map(|(node, key)| format!("{node} = \"{key}\""))
            .collect();
        format!("[registry]\n{}\n", lines.join("\n"))
    };
    // A's file names node-1; B's names node-1 and node-3.
    let a_config = config(&server.endpoint, &registry(&[("node-1", &key1)]));
    let b_config = config(
        &server.endpoint,
        &registry(&[("node-1", &key1), ("node-3", &key3)]),
    );
    let (node1, node2, node3) = (
        common::node("node-1"),
        common::node("node-2"),
        common::node("node-3"),
    );
    live_for(Duration::from_secs(90), async {
        let mut a = Replica::start(&a_config).unwrap();
        let live = a.lead(None).await.unwrap();
        assert_eq!(
            live.registered().keys().cloned().collect::<Vec<_>>(),
            vec![node1.clone()]
        );
        // B starts while A leads: the registry is A's, written at its term.
        let mut b = Replica::start(&b_config).unwrap();
        live.register(node2.clone(), key2).await.unwrap();
        // A's term ends (its leader key gone): B leads, from what A wrote.
        a.resign();
        live.stop().await;
        let next = tokio::time::timeout(Duration::from_secs(15), b.lead(None))
            .await
            .expect("b leads")
            .unwrap();
        let held = next.registered();
        assert_eq!(
            held.keys().cloned().collect::<Vec<_>>(),
            vec![node1.clone(), node2.clone()],
            "B leads with the shared registry, not its file's (node-3)"
        );
        assert_eq!(held.get(&node2), Some(&key2));
        assert!(!held.contains_key(&node3));
        // B's own change is written too: the same replica's next term
        // keeps it.
        next.unregister(&node1).await.unwrap();
        let again = a_next_term(&server, b"/poolgate/replicas/pool-a/leader", &mut b, next).await;
        assert_eq!(
            again.registered().keys().cloned().collect::<Vec<_>>(),
            vec![node2.clone()],
            "the same replica's next term"
        );
        again.shutdown();
        b.resign();
    });
}

/// An operator's trial: a replica's terms started from its file as it
/// was at start, so a reload was forgotten at its next term: a pool
/// reloaded to three members led again with two, on another replica or
/// the same one. Now a reload leaves what it read for the next term
/// (`Replica::reloads`, what `watch` does on SIGHUP).
#[test]
fn a_replicas_next_term_starts_from_its_file_as_last_reloaded() {
    need_etcd!();
    let _one_at_a_time = one_at_a_time();
    let server = etcd::Etcd::start("reloaded-terms");
    let config = config(&server.endpoint, "");
    let mut reloaded = config.clone();
    reloaded.pool = poolgate::core::PoolDefinition::new(
        config.pool.id().clone(),
        vec![common::node("node-1"), common::node("node-2")],
    )
    .unwrap();
    live_for(Duration::from_secs(60), async {
        let mut b = Replica::start(&config).unwrap();
        let live = b.lead(None).await.unwrap();
        let members = |report: poolgate::core::PoolReport| {
            report
                .candidates
                .iter()
                .map(|c| c.node.to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(members(live.gate.report().await.unwrap()), ["node-1"]);
        // SIGHUP: the file read again (here, as `watch` leaves it).
        b.reloads().put(reloaded.clone());
        let next = a_next_term(&server, b"/poolgate/replicas/pool-a/leader", &mut b, live).await;
        assert_eq!(
            members(next.gate.report().await.unwrap()),
            ["node-1", "node-2"],
            "the next term starts from the file as reloaded"
        );
        next.shutdown();
        b.resign();
    });
}

/// A reload among replicas whose registry write fails (etcd out of reach
/// for a moment) is not the whole reload lost: what could not be written
/// is said and left undone, the rest (here the pool's members) applies.
/// Before, the failed write ended the reload there and the log said
/// "configuration not read again; keeping the running one" though some
/// of it could already have applied.
#[test]
fn a_reload_whose_registry_write_fails_says_so_and_applies_the_rest() {
    need_etcd!();
    let _one_at_a_time = one_at_a_time();
    let server = etcd::Etcd::start("reload-write-fails");
    let proxy = etcd::Proxy::start(server.port());
    let config = config_of(&[proxy.endpoint()], "", "10s");
    let mut reloaded = config.clone();
    let node2 = common::node("node-2");
    reloaded
        .registry
        .insert(node2.clone(), poolgate::keys::NodeKey::generate().public());
    reloaded.pool = poolgate::core::PoolDefinition::new(
        config.pool.id().clone(),
        vec![common::node("node-1"), node2.clone()],
    )
    .unwrap();
    live_for(Duration::from_secs(60), async {
        let mut b = Replica::start(&config).unwrap();
        let live = b.lead(None).await.unwrap();
        proxy.set_cut(true);
        let said = live.reload(&reloaded).await;
        proxy.set_cut(false);
        let said = said.expect("the reload applies what it can");
        assert!(
            said.iter().any(|s| s.starts_with("node-2: NOT registered")),
            "{said:?}"
        );
        assert!(
            !live.registered().contains_key(&node2),
            "not written, not applied"
        );
        let members: Vec<String> = live
            .gate
            .report()
            .await
            .unwrap()
            .candidates
            .iter()
            .map(|c| c.node.to_string())
            .collect();
        assert_eq!(
            members,
            ["node-1", "node-2"],
            "the pool's change applied: {said:?}"
        );
        live.shutdown();
        b.resign();
    });
}

/// A follower `watch` given SIGHUP leaves what it read for its next term:
/// once the leader stops, the follower leads with the pool as its file
/// now says (two members), not as it was at start (one). Through real
/// processes and a real signal (the API path is the test above).
#[test]
fn a_follower_watch_given_sighup_leads_its_next_term_from_the_file_as_reloaded() {
    need_etcd!();
    let _one_at_a_time = one_at_a_time();
    let server = etcd::Etcd::start("follower-sighup");
    let dir = std::env::temp_dir().join(format!("poolgate-follower-sighup-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let file = |name: &str, members: &str| {
        let port = etcd::free_port();
        let endpoint = server.endpoint.clone();
        let path = dir.join(format!("{name}.toml"));
        let text = move |members: &str| {
            format!(
                "[pool]\nid = \"pool-a\"\nmembers = [{members}]\n[readiness]\nconvergence_window = \"50ms\"\n\
                 [swim]\nbind = \"127.0.0.1:0\"\ninsecure = true\nlabel = \"sighup\"\n\
                 [agents]\nlisten = \"127.0.0.1:{port}\"\n\
                 [state]\netcd = [\"{endpoint}\"]\nlease = \"10s\"\ninsecure = true\n"
            )
        };
        std::fs::write(&path, text(members)).unwrap();
        (path, text)
    };
    let (a, _) = file("a", "\"node-1\"");
    let (b, b_text) = file("b", "\"node-1\"");
    let start = |config: &std::path::Path, log: &str| {
        let log = std::fs::File::create(dir.join(log)).unwrap();
        Killed(
            std::process::Command::new(env!("CARGO_BIN_EXE_poolgate"))
                .args(["watch", "--config"])
                .arg(config)
                .env("RUST_LOG", "poolgate=info")
                .stdout(std::process::Stdio::null())
                .stderr(log)
                .spawn()
                .unwrap(),
        )
    };
    let status = |config: &std::path::Path| -> serde_json::Value {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_poolgate"))
            .args(["status", "--json", "--config"])
            .arg(config)
            .output()
            .unwrap();
        serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null)
    };
    let members = |answer: &serde_json::Value| -> Vec<String> {
        answer["candidates"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c["node"].as_str().map(String::from))
            .collect()
    };
    let until = |what: &str, check: &dyn Fn() -> bool| {
        let deadline = std::time::Instant::now() + Duration::from_secs(25);
        while !check() {
            assert!(std::time::Instant::now() < deadline, "{what} within 25 s");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let leader = start(&a, "a.log");
    until("a leads", &|| members(&status(&a)) == ["node-1"]);
    let follower = start(&b, "b.log");
    let b_log = dir.join("b.log");
    let logged =
        |needle: &str| std::fs::read_to_string(&b_log).is_ok_and(|text| text.contains(needle));
    until("b follows", &|| logged("follow"));
    std::fs::write(&b, b_text("\"node-1\", \"node-2\"")).unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(follower.0.id() as i32),
        nix::sys::signal::Signal::SIGHUP,
    )
    .unwrap();
    until("b reads its file again", &|| {
        logged("SIGHUP among replicas")
    });
    // A clean stop gives the lease up: b leads at once, from its file as
    // read at the SIGHUP.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(leader.0.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    until("b leads with node-1 and node-2", &|| {
        members(&status(&b)) == ["node-1", "node-2"]
    });
    drop((leader, follower));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A child process, killed and reaped when dropped.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A pool added to `[pools.<id>]` and read by a reload (SIGHUP) is served
/// from the replica's next term, with its own record and epochs above
/// any the prefix told; a pool removed from the file while the replicas
/// run stays served (a restart removes it), so no run it holds is left
/// unguarded. Before, any change of the pools' ids was set aside whole.
#[test]
fn a_pool_added_by_a_reload_among_replicas_is_served_from_the_next_term() {
    need_etcd!();
    let _one_at_a_time = one_at_a_time();
    let server = etcd::Etcd::start("pools-reloaded");
    let pools = |pools: &[(&str, &[&str])]| pools_config(&server.endpoint, "grown", "50ms", pools);
    let config = pools(&[("a", &["node-1"]), ("b", &["node-2"])]);
    // b removed, c added.
    let reloaded = pools(&[("a", &["node-1"]), ("c", &["node-1", "node-2"])]);
    let pool = |id: &str| poolgate::core::PoolId::new(id).unwrap();
    live_for(Duration::from_secs(60), async {
        let mut replica = Replica::start(&config).unwrap();
        let live = replica.lead(None).await.unwrap();
        assert_eq!(live.fleet.pools(), vec![pool("a"), pool("b")]);
        replica.reloads().put(reloaded.clone());
        let next = a_next_term(&server, b"/poolgate/grown/a/leader", &mut replica, live).await;
        assert_eq!(
            next.fleet.pools(),
            vec![pool("a"), pool("c")],
            "c served from the next term; b, with no run, no longer"
        );
        let members: Vec<String> = next
            .fleet
            .pool(&pool("c"))
            .unwrap()
            .report()
            .await
            .unwrap()
            .candidates
            .iter()
            .map(|c| c.node.to_string())
            .collect();
        assert_eq!(members, ["node-1", "node-2"]);
        next.shutdown();
        replica.resign();
    });
}

/// With `[pools.<id>]` and no `[state] prefix`, the first pool's id names
/// the state's prefix: a pool added to the file with an id that sorts
/// first moved it, and the replicas restarted on an empty prefix, every
/// pool's epochs starting over (epochs told twice). A replica now
/// refuses to start on an empty prefix while etcd holds one of its
/// pools' state under another of the cluster label's, naming the
/// `[state] prefix` to set.
#[test]
fn a_replica_whose_pools_state_lives_under_another_prefix_refuses_to_start_and_names_it() {
    need_etcd!();
    let _one_at_a_time = one_at_a_time();
    let server = etcd::Etcd::start("moved-prefix");
    let pools = |pools: &[(&str, &[&str])]| pools_config(&server.endpoint, "moved", "20ms", pools);
    let first = pools(&[("b", &["node-1"])]);
    let grown = pools(&[("a", &["node-2"]), ("b", &["node-1"])]);
    let b = poolgate::core::PoolId::new("b").unwrap();
    live_for(Duration::from_secs(60), async {
        let mut replica = Replica::start(&first).unwrap();
        let live = replica.lead(None).await.unwrap();
        let gate = live.fleet.pool(&b).unwrap();
        let mut events = gate.subscribe();
        make_ready(&gate, "node-1").await;
        assert_eq!(ready(&mut events).await.0, 1);
        live.stop().await;
        replica.resign();
        let refused = Replica::start(&grown).expect_err("refused: pool b's state is elsewhere");
        let said = refused.to_string();
        assert!(
            said.contains("/poolgate/moved/b/") && said.contains("[state] prefix"),
            "{said}"
        );
        // With the prefix set, it starts, and pool b's epochs go on.
        let mut kept = grown.clone();
        kept.state.prefix = Some("/poolgate/moved/b/".into());
        let mut replica = Replica::start(&kept).unwrap();
        let live = replica.lead(None).await.unwrap();
        let gate = live.fleet.pool(&b).unwrap();
        let mut events = gate.subscribe();
        make_ready(&gate, "node-1").await;
        assert_eq!(ready(&mut events).await.0, 2);
        live.shutdown();
        replica.resign();
    });
}

/// A pool a reload adds on the leader among replicas is served at once:
/// its own record under `pools/<id>/`, fenced by the term, and runs asked
/// of it through etcd committed; the next term goes on from its record
/// (its epochs above the ones it told). A pool removed goes at once (no
/// run of it is committed). Before, the leader refused the new pool
/// ("added by restarting the replicas"), and kept a removed one until
/// every replica restarted.
#[test]
fn a_pool_added_on_the_leader_among_replicas_is_served_at_once_and_kept() {
    need_etcd!();
    let _one_at_a_time = one_at_a_time();
    let server = etcd::Etcd::start("pools-live");
    let pools = |pools: &[(&str, &[&str])]| pools_config(&server.endpoint, "live", "20ms", pools);
    let config = pools(&[("a", &["node-1"]), ("b", &["node-1"])]);
    let grown = pools(&[("a", &["node-1"]), ("c", &["node-2"])]);
    let pool = |id: &str| poolgate::core::PoolId::new(id).unwrap();
    let node = |id: &str| poolgate::core::NodeId::new(id).unwrap();
    live_for(Duration::from_secs(60), async {
        let mut replica = Replica::start(&config).unwrap();
        let live = replica.lead(None).await.unwrap();
        // A file whose pools move the prefix (a pool sorting before a,
        // whose id names it) adds nothing: the next term would not find it.
        let moved = pools(&[("0", &["node-3"]), ("a", &["node-1"]), ("b", &["node-1"])]);
        let said = live.reload(&moved).await.unwrap();
        assert!(
            said.iter().any(|s| s.starts_with("pool 0: NOT defined")),
            "{said:?}"
        );
        assert!(live.fleet.pool(&pool("0")).is_none());
        let said = live.reload(&grown).await.unwrap();
        assert!(
            said.iter().any(|s| s.starts_with("pool c: defined")),
            "{said:?}"
        );
        assert!(said.iter().any(|s| s == "pool b: removed"), "{said:?}");
        assert_eq!(live.fleet.pools(), vec![pool("a"), pool("c")]);
        // A run asked of pool c through etcd, as `run --pool c` would.
        let asks =
            poolgate::ha::replica::requests_of(&grown.with_only_pool(Some("c")).unwrap()).unwrap();
        let rc = poolgate::core::RunId::new("rc").unwrap();
        let _session = asks
            .ask_of(
                Some(&pool("c")),
                &rc,
                &[node("node-2")],
                Duration::from_secs(5),
            )
            .await
            .unwrap();
        poolgate_actors::testing::make_ready_in(&live.fleet, &node("node-2"), b"key")
            .await
            .unwrap();
        let committed =
            tokio::time::timeout(Duration::from_secs(10), committed(asks.clone(), rc.clone()))
                .await
                .expect("pool c's run committed");
        let Some(Event::RunCommitted { epoch, pool: p, .. }) = committed.event else {
            panic!("not a commit: {committed:?}");
        };
        assert_eq!(p, pool("c"));
        // The next term (the file as reloaded): c goes on from its record,
        // its run restored.
        replica.reloads().put(grown.clone());
        let next = a_next_term(&server, b"/poolgate/live/a/leader", &mut replica, live).await;
        let report = next
            .fleet
            .pool(&pool("c"))
            .expect("c in the next term")
            .report()
            .await
            .unwrap();
        assert_eq!(
            report.run,
            Some(rc.clone()),
            "its run (epoch {epoch}) restored"
        );
        next.shutdown();
        replica.resign();
    });
}

/// A pool a reload removes among replicas while its run is committed:
/// the leader keeps it ("NOT removed while run … is committed"), and the
/// next term, whose file no longer has it, still serves it from its
/// record in etcd (the run restored, still guarded); once the run ended,
/// the term after that serves it no more. Before, a removed pool stayed
/// served until every replica restarted.
#[test]
fn a_pool_removed_among_replicas_is_served_only_while_its_run_is_committed() {
    need_etcd!();
    let _one_at_a_time = one_at_a_time();
    let server = etcd::Etcd::start("pools-removed");
    let (config, shrunk) = a_and_b_then_a(&server.endpoint, "gone", &["node-2"]);
    let pool = |id: &str| poolgate::core::PoolId::new(id).unwrap();
    let node = |id: &str| poolgate::core::NodeId::new(id).unwrap();
    live_for(Duration::from_secs(60), async {
        let mut replica = Replica::start(&config).unwrap();
        let live = replica.lead(None).await.unwrap();
        poolgate_actors::testing::make_ready_in(&live.fleet, &node("node-2"), b"key")
            .await
            .unwrap();
        let b = live.fleet.pool(&pool("b")).unwrap();
        let epoch = b.wait_ready().await.unwrap().epoch;
        let run = poolgate::core::RunId::new("rb").unwrap();
        b.begin_planning(run.clone(), Some(epoch)).await.unwrap();
        b.commit_plan(run.clone(), vec![node("node-2")], Some(epoch))
            .await
            .unwrap();
        let said = live.reload(&shrunk).await.unwrap();
        assert!(
            said.iter()
                .any(|s| s.starts_with("pool b: NOT removed while run rb is committed")),
            "{said:?}"
        );
        assert_eq!(live.fleet.pools(), vec![pool("a"), pool("b")]);
        // The next term, from the file as reloaded: b served still, its
        // run restored and guarded.
        replica.reloads().put(shrunk.clone());
        let next = a_next_term(&server, b"/poolgate/gone/a/leader", &mut replica, live).await;
        let kept = next
            .fleet
            .pool(&pool("b"))
            .expect("b served while its run is");
        assert_eq!(kept.report().await.unwrap().run, Some(run.clone()));
        kept.finish_run(run).await.unwrap();
        // The term after: b's record holds no run, and b is no longer
        // served.
        let after = a_next_term(&server, b"/poolgate/gone/a/leader", &mut replica, next).await;
        assert_eq!(after.fleet.pools(), vec![pool("a")]);
        after.shutdown();
        replica.resign();
    });
}

/// A run asked of the leader's pool over a node a reload took out of it
/// is refused at once, naming the node. (Before, the leader checked the
/// pool's members as they were when its term began: it began planning
/// such a run, and could never commit it.)
#[test]
fn a_run_over_a_node_a_reload_took_out_of_the_pool_is_refused_at_once() {
    need_etcd!();
    let _one_at_a_time = one_at_a_time();
    let server = etcd::Etcd::start("pools-shrunk");
    let config = pools_config(
        &server.endpoint,
        "shrunk",
        "20ms",
        &[("a", &["node-1", "node-2"])],
    );
    let shrunk = pools_config(&server.endpoint, "shrunk", "20ms", &[("a", &["node-1"])]);
    let node = |id: &str| poolgate::core::NodeId::new(id).unwrap();
    live_for(Duration::from_secs(60), async {
        let mut replica = Replica::start(&config).unwrap();
        let live = replica.lead(None).await.unwrap();
        let said = live.reload(&shrunk).await.unwrap();
        assert!(said.iter().any(|s| s.contains("node-2")), "{said:?}");
        poolgate_actors::testing::make_ready_in(&live.fleet, &node("node-1"), b"key")
            .await
            .unwrap();
        let a = live
            .fleet
            .pool(&poolgate::core::PoolId::new("a").unwrap())
            .unwrap();
        a.wait_ready().await.unwrap();
        let requests = poolgate::ha::replica::requests_of(&config).unwrap();
        let run = poolgate::core::RunId::new("over-node-2").unwrap();
        let _session = requests
            .ask(&run, &[node("node-2")], Duration::from_secs(5))
            .await
            .unwrap();
        let refused = tokio::time::timeout(
            Duration::from_secs(10),
            outcome_of(&requests, &run, "refused"),
        )
        .await;
        let planning = a.report().await.unwrap().run;
        let refused =
            refused.unwrap_or_else(|_| panic!("not refused; the pool's run: {planning:?}"));
        assert!(
            refused
                .reason
                .as_deref()
                .is_some_and(|r| r.contains("node-2")),
            "{refused:?}"
        );
        assert_eq!(a.report().await.unwrap().run, None, "no planning begun");
        live.shutdown();
        replica.resign();
    });
}

/// An operator's trial: `run --pool c` asked of a pool a reload had
/// removed from the leader waited out its timeout and said "c ready, epoch
/// 4 (the leader said so 24 s ago)", the last status the leader had
/// published of it. The leader now publishes that it no longer serves it.
#[test]
fn a_pool_removed_among_replicas_is_published_as_no_longer_served() {
    need_etcd!();
    let _one_at_a_time = one_at_a_time();
    let server = etcd::Etcd::start("pools-unserved");
    let (config, shrunk) = a_and_b_then_a(&server.endpoint, "unserved", &["node-2"]);
    let node = |id: &str| poolgate::core::NodeId::new(id).unwrap();
    live_for(Duration::from_secs(60), async {
        let mut replica = Replica::start(&config).unwrap();
        let live = replica.lead(None).await.unwrap();
        poolgate_actors::testing::make_ready_in(&live.fleet, &node("node-2"), b"key")
            .await
            .unwrap();
        status_of_b_says(&server, "unserved", "\"ready\"").await;
        let said = live.reload(&shrunk).await.unwrap();
        assert!(said.iter().any(|s| s == "pool b: removed"), "{said:?}");
        let status = status_of_b_says(&server, "unserved", "removed").await;
        assert!(
            status.iter().all(|s| !s.contains("\"ready\"")),
            "{status:?}"
        );
        live.shutdown();
        replica.resign();
    });
}

#[test]
fn a_pool_removed_while_etcd_is_out_of_reach_is_published_once_it_is_back() {
    // The leader wrote "removed" once, when the pool went: etcd out of
    // reach at that moment, and the pool's last status said ready for
    // the rest of the term.
    need_etcd!();
    let _one_at_a_time = one_at_a_time();
    let server = etcd::Etcd::start("pools-unserved-cut");
    let proxy = etcd::Proxy::start(server.port());
    let (config, shrunk) = a_and_b_then_a(&proxy.endpoint(), "unservedcut", &["node-2"]);
    live_for(Duration::from_secs(60), async {
        let mut replica = Replica::start(&config).unwrap();
        let live = replica.lead(None).await.unwrap();
        poolgate_actors::testing::make_ready_in(&live.fleet, &common::node("node-2"), b"key")
            .await
            .unwrap();
        status_of_b_says(&server, "unservedcut", "\"ready\"").await;
        // Cut for half a second (the 10 s lease rides through it).
        proxy.set_cut(true);
        let said = live.reload(&shrunk).await.unwrap();
        assert!(said.iter().any(|s| s == "pool b: removed"), "{said:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
        proxy.set_cut(false);
        status_of_b_says(&server, "unservedcut", "removed").await;
        live.shutdown();
        replica.resign();
    });
}

/// An operator's trial: a pool removed from the files while its run is
/// committed, and a replica started afresh on its file (not reloaded)
/// leads: it served only the pools its file named, and the run was left
/// unguarded (a SIGKILL of its node faulted nothing). It now serves a
/// pool etcd holds a committed run of, over the run's required nodes.
#[test]
fn a_replica_started_without_a_pool_whose_run_is_committed_still_guards_the_run() {
    need_etcd!();
    let _one_at_a_time = one_at_a_time();
    let server = etcd::Etcd::start("pools-restarted");
    let (config, shrunk) = a_and_b_then_a(&server.endpoint, "fresh", &["node-2", "node-3"]);
    let pool = |id: &str| poolgate::core::PoolId::new(id).unwrap();
    let node = |id: &str| poolgate::core::NodeId::new(id).unwrap();
    live_for(Duration::from_secs(60), async {
        let first = Replica::start(&config).unwrap();
        let mut first = first;
        let live = first.lead(None).await.unwrap();
        for n in ["node-2", "node-3"] {
            poolgate_actors::testing::make_ready_in(&live.fleet, &node(n), b"key")
                .await
                .unwrap();
        }
        let b = live.fleet.pool(&pool("b")).unwrap();
        let epoch = b.wait_ready().await.unwrap().epoch;
        let run = poolgate::core::RunId::new("rb").unwrap();
        b.begin_planning(run.clone(), Some(epoch)).await.unwrap();
        b.commit_plan(run.clone(), vec![node("node-2")], Some(epoch))
            .await
            .unwrap();
        live.stop().await;
        first.resign();
        let mut fresh = Replica::start(&shrunk).unwrap();
        let next = fresh.lead(None).await.unwrap();
        let kept = next
            .fleet
            .pool(&pool("b"))
            .expect("b served while its run is committed");
        let report = kept.report().await.unwrap();
        assert_eq!(report.run, Some(run.clone()));
        let members: Vec<String> = report
            .candidates
            .iter()
            .map(|c| c.node.to_string())
            .collect();
        assert_eq!(members, ["node-2"], "over the run's required nodes");
        kept.finish_run(run).await.unwrap();
        next.shutdown();
        fresh.resign();
    });
}

/// A replica configuration with `pools` (each `[pools.<id>]` and its
/// members) on `server`: the cluster label `label`, the window `window`,
/// the 10 s lease.
/// The config of pools a (node-1) and b (`b`), in `label`'s 20 ms window,
/// and the same file with b removed.
/// What the leader published of pool b under `label`, once it says
/// `wanted` (bounded).
async fn status_of_b_says(server: &etcd::Etcd, label: &str, wanted: &str) -> Vec<String> {
    let client = server.client();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let said: Vec<String> = client
            .get_prefix(format!("/poolgate/{label}/").as_bytes())
            .unwrap()
            .into_iter()
            .filter(|kv| {
                let key = String::from_utf8_lossy(&kv.key);
                key.contains("/b/") && key.ends_with("/status")
            })
            .map(|kv| String::from_utf8_lossy(&kv.value).into_owned())
            .collect();
        if said.iter().any(|s| s.contains(wanted)) {
            return said;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "b's status never said {wanted}: {said:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn a_and_b_then_a(endpoint: &str, label: &str, b: &[&str]) -> (Config, Config) {
    (
        pools_config(endpoint, label, "20ms", &[("a", &["node-1"]), ("b", b)]),
        pools_config(endpoint, label, "20ms", &[("a", &["node-1"])]),
    )
}

fn pools_config(endpoint: &str, label: &str, window: &str, pools: &[(&str, &[&str])]) -> Config {
    let tables: String = pools
        .iter()
        .map(|(id, members)| {
            let members: Vec<String> = members.iter().map(|m| format!("\"{m}\"")).collect();
            format!("[pools.{id}]\nmembers = [{}]\n", members.join(", "))
        })
        .collect();
    let text = format!(
        "{tables}[readiness]\nconvergence_window = \"{window}\"\n\
         [swim]\nbind = \"127.0.0.1:0\"\ninsecure = true\nlabel = \"{label}\"\n\
         [agents]\nlisten = \"127.0.0.1:0\"\n\
         [state]\netcd = [\"{endpoint}\"]\nlease = \"10s\"\ninsecure = true\n"
    );
    Config::parse(&text, "config.toml").expect("config")
}

/// An etcd of its own, `name`, and a proxy to it (which the test cuts or
/// stalls).
fn behind_proxy(name: &str) -> (etcd::Etcd, etcd::Proxy) {
    let server = etcd::Etcd::start(name);
    let proxy = etcd::Proxy::start(server.port());
    (server, proxy)
}

/// `run`'s outcome once its requester sees it committed.
async fn committed(
    requests: poolgate::ha::requests::Requests,
    run: poolgate::core::RunId,
) -> poolgate::ha::requests::RunOutcome {
    loop {
        if let Some(o) = requests.outcome(&run).await.unwrap() {
            if o.status == "committed" {
                return o;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A follower whose file a reload (SIGHUP) grew by a pool answers
/// `status --pool` for it with what the leader publishes of it, before
/// it ever leads. Before, it said "no pool c" until its next term.
#[test]
fn a_follower_reloaded_with_a_pool_answers_status_for_it() {
    need_etcd!();
    let _one_at_a_time = one_at_a_time();
    let server = etcd::Etcd::start("follower-pools");
    let pools = |pools: &[(&str, &[&str])]| pools_config(&server.endpoint, "fp", "20ms", pools);
    let config = pools(&[("a", &["node-1"])]);
    let grown = pools(&[("a", &["node-1"]), ("c", &["node-2"])]);
    let mut follower_config = config.clone();
    follower_config.agents.listen = ([127, 0, 0, 1], etcd::free_port()).into();
    let mut follower_grown = grown.clone();
    follower_grown.agents.listen = follower_config.agents.listen;
    live_for(Duration::from_secs(60), async {
        let mut a = Replica::start(&config).unwrap();
        let live = a.lead(None).await.unwrap();
        let mut b = Replica::start(&follower_config).unwrap();
        let b_reloads = b.reloads();
        let following = actix::spawn(async move {
            let _ = b.lead(None).await;
        });
        let said = live.reload(&grown).await.unwrap();
        assert!(
            said.iter().any(|s| s.starts_with("pool c: defined")),
            "{said:?}"
        );
        // b's SIGHUP, as `watch` hands it over.
        b_reloads.put(follower_grown.clone());
        let addr = follower_config.agents.listen;
        let answered = tokio::time::timeout(Duration::from_secs(15), async {
            loop {
                if let Ok(answer) = poolgate::live::status::ask_pool(addr, Some("c")).await {
                    if answer["pool"] == "c" && answer["leader_said"]["pool"] == "c" {
                        return answer;
                    }
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
        .await;
        following.abort();
        live.shutdown();
        a.resign();
        let answer = answered.expect("the follower answers for pool c");
        assert_eq!(answer["phase"], "following", "{answer}");
    });
}

/// An operator's trial: while etcd had no quorum every follower's
/// `status` (and `/readyz`) timed out after the asker's 3 s, though the
/// follower was up: its answer waited on etcd for what the leader
/// published. It now answers within a second, saying etcd did not answer.
#[test]
fn a_follower_answers_status_while_etcd_answers_nothing() {
    need_etcd!();
    let _one_at_a_time = one_at_a_time();
    let (server, proxy) = behind_proxy("follower-stalled");
    let config = pools_config(&server.endpoint, "fs", "20ms", &[("a", &["node-1"])]);
    let mut follower_config = pools_config(&proxy.endpoint(), "fs", "20ms", &[("a", &["node-1"])]);
    follower_config.agents.listen = ([127, 0, 0, 1], etcd::free_port()).into();
    let addr = follower_config.agents.listen;
    live_for(Duration::from_secs(60), async {
        let mut a = Replica::start(&config).unwrap();
        let live = a.lead(None).await.unwrap();
        let mut b = Replica::start(&follower_config).unwrap();
        let following = actix::spawn(async move {
            let _ = b.lead(None).await;
        });
        let read = tokio::time::timeout(Duration::from_secs(15), async {
            loop {
                if let Ok(answer) = poolgate::live::status::ask_pool(addr, None).await {
                    if answer["leader_said"]["pool"] == "a" {
                        return answer;
                    }
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
        .await;
        assert!(
            read.is_ok(),
            "the follower never told what the leader published"
        );
        proxy.set_stalled(true);
        // The asker's own deadline is 3 s.
        let stalled = poolgate::live::status::ask_pool(addr, None).await;
        proxy.set_stalled(false);
        following.abort();
        live.shutdown();
        a.resign();
        let answer = stalled.expect("the follower answers while etcd answers nothing");
        assert_eq!(answer["phase"], "following", "{answer}");
        assert!(answer["leader_said"].is_null(), "{answer}");
        assert!(
            answer["leader_said_unread"]
                .as_str()
                .is_some_and(|why| why.contains("etcd did not answer")),
            "{answer}"
        );
    });
}

/// An operator's trial (q38): etcd lost its quorum; the leader stepped
/// down at its renew deadline, unable to revoke its lease; etcd, electing
/// a raft leader of its own again, gave every lease a fresh TTL. Once etcd
/// answered, the leader key still named the replica that had stepped down,
/// which followed itself, and nobody led until that lease expired (12.5 s).
/// Here the replica is cut from etcd (its revoke refused, where a proxy
/// that holds what it read would deliver it later) and the test keeps the
/// lease alive, as etcd's election did: the replica must revoke the lease
/// of the term it stepped down from once etcd answers, and lead again.
#[test]
fn a_leader_that_stepped_down_unable_to_revoke_its_lease_revokes_it_once_etcd_answers() {
    need_etcd!();
    let _one_at_a_time = one_at_a_time();
    let (server, proxy) = behind_proxy("unrevoked");
    let config = pools_config(&proxy.endpoint(), "ur", "20ms", &[("a", &["node-1"])]);
    let direct = server.client();
    live_for(Duration::from_secs(60), async {
        let mut a = Replica::start(&config).unwrap();
        let live = a.lead(None).await.unwrap();
        let key = direct
            .get_prefix(config.etcd_prefix().as_bytes())
            .unwrap()
            .into_iter()
            .find(|kv| kv.key.ends_with(b"leader"))
            .expect("the leader key");
        let lease = key.lease;
        // Renewed as etcd's new raft leader would renew it, until revoked.
        let keep =
            |direct: &poolgate::ha::etcd::Etcd| matches!(direct.keep_alive(lease), Ok(Some(_)));
        proxy.set_cut(true);
        let deposed = tokio::time::timeout(Duration::from_secs(15), async {
            while a.leads() {
                keep(&direct);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
        .await;
        live.shutdown();
        assert!(deposed.is_ok(), "a never stepped down while cut from etcd");
        // The outage outlasts the step down (in the trial, by 20 s): the
        // revoke a tries as it steps down is refused.
        let outage_ends = tokio::time::Instant::now() + Duration::from_secs(1);
        while tokio::time::Instant::now() < outage_ends {
            keep(&direct);
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        proxy.set_cut(false);
        let led_again = tokio::time::timeout(Duration::from_secs(8), async {
            while !a.leads() {
                keep(&direct);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
        .await;
        let named = direct
            .get(&key.key)
            .ok()
            .flatten()
            .map(|kv| (kv.lease, String::from_utf8_lossy(&kv.value).into_owned()));
        a.resign();
        assert!(
            led_again.is_ok(),
            "nobody led 8 s after etcd answered again: the key still {named:?} (the lease a stepped down from: {lease})"
        );
    });
}

/// An operator's trial (q39): `run --timeout 4s`, whose etcd lost its
/// quorum while it waited, exited 15.4 s after it began, silent for 11 s:
/// giving up, it withdrew its request and read what blocks the pool, each
/// etcd call waiting out the client's own timeout, and the process then
/// waited for those calls to end. Now what it says at `--timeout` is said
/// within a bound of its own (2 s), naming etcd.
#[test]
fn run_gives_up_at_its_timeout_while_etcd_answers_nothing() {
    need_etcd!();
    let _one_at_a_time = one_at_a_time();
    let (server, proxy) = behind_proxy("give-up");
    let leader_config = pools_config(&server.endpoint, "gu", "20ms", &[("a", &["node-1"])]);
    let dir = std::env::temp_dir().join(format!("poolgate-give-up-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[pools.a]\nmembers = [\"node-1\"]\n[readiness]\nconvergence_window = \"20ms\"\n\
             [swim]\nbind = \"127.0.0.1:0\"\ninsecure = true\nlabel = \"gu\"\n\
             [agents]\nlisten = \"127.0.0.1:{}\"\n\
             [state]\netcd = [\"{}\"]\nlease = \"10s\"\ninsecure = true\n",
            etcd::free_port(),
            proxy.endpoint()
        ),
    )
    .unwrap();
    let log = dir.join("run.log");
    let direct = server.client();
    let prefix = leader_config.etcd_prefix();
    live_for(Duration::from_secs(60), async {
        let mut a = Replica::start(&leader_config).unwrap();
        let live = a.lead(None).await.unwrap();
        let mut run = std::process::Command::new(env!("CARGO_BIN_EXE_poolgate"))
            .args(["run", "--pool", "a", "--config"])
            .arg(&config)
            .args(["--timeout", "4s", "--", "true"])
            .env("RUST_LOG", "info")
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        // Asked (the pool is never ready: node-1 runs nowhere); then etcd
        // answers nothing.
        let asked = asked_under(&direct, prefix.as_bytes()).await;
        proxy.set_stalled(true);
        let stalled = tokio::time::Instant::now();
        let exited = tokio::time::timeout(Duration::from_secs(30), async {
            loop {
                if let Ok(Some(status)) = run.try_wait() {
                    return status;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await;
        let took = stalled.elapsed();
        proxy.set_stalled(false);
        let _ = run.kill();
        let _ = run.wait();
        live.shutdown();
        a.resign();
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(
            asked.is_ok(),
            "the run's request never reached etcd: {text}"
        );
        let status = exited.unwrap_or_else(|_| panic!("run did not exit: {text}"));
        assert_eq!(status.code(), Some(1), "{text}");
        // Its 4 s (counted from before the stall began), then at most 2 s.
        assert!(
            took < Duration::from_secs(7),
            "run exited {took:?} after etcd stopped answering, with --timeout 4s: {text}"
        );
        assert!(
            text.contains("was not committed within 4s") && text.contains("etcd did not answer"),
            "{text}"
        );
    });
}

#[test]
fn a_run_the_leaders_pool_lacks_a_node_of_is_refused_though_the_pool_is_not_ready() {
    // An operator's trial: the leader refused a plan with a node its pool
    // does not have only once the pool was ready; with the pool never
    // ready, `run` waited out its timeout (exit 1) saying what blocked
    // the pool, never the node. Here the requester's file lists node-2,
    // the leader's does not, and no node runs.
    need_etcd!();
    let _one_at_a_time = one_at_a_time();
    let server = etcd::Etcd::start("stranger");
    let leader_config = pools_config(&server.endpoint, "st", "20ms", &[("a", &["node-1"])]);
    live_for(Duration::from_secs(60), async {
        let mut a = Replica::start(&leader_config).unwrap();
        let live = a.lead(None).await.unwrap();
        let pools = "[pools.a]\nmembers = [\"node-1\", \"node-2\"]\n";
        let mut run = Requester::start("stranger", "st", &server.endpoint, pools, "a");
        let (status, took, text) = run.exit_within(Duration::from_secs(30)).await;
        live.shutdown();
        a.resign();
        assert_eq!(status, Some(2), "after {took:?}: {text}");
        assert!(
            text.contains("refused by the leader: node-2 is not a member of the leader's pool"),
            "{text}"
        );
        assert!(took < Duration::from_secs(10), "refused after {took:?}");
    });
}

#[test]
fn a_run_asked_of_a_pool_the_leaders_reload_removes_is_refused_naming_it() {
    // An operator's trial: alone and beside a watch such a run was
    // refused at once; among replicas it waited out its timeout (exit 1).
    need_etcd!();
    let _one_at_a_time = one_at_a_time();
    let server = etcd::Etcd::start("removed-asked");
    let (config, shrunk) = a_and_b_then_a(&server.endpoint, "ra", &["node-2"]);
    live_for(Duration::from_secs(60), async {
        let mut a = Replica::start(&config).unwrap();
        let live = a.lead(None).await.unwrap();
        let pools = "[pools.a]\nmembers = [\"node-1\"]\n[pools.b]\nmembers = [\"node-2\"]\n";
        let mut run = Requester::start("removed-asked", "ra", &server.endpoint, pools, "b");
        // Asked (pool b is never ready: node-2 runs nowhere).
        let direct = server.client();
        let asked = asked_under(&direct, b"/poolgate/ra/").await;
        let said = live.reload(&shrunk).await.unwrap();
        let (status, took, text) = run.exit_within(Duration::from_secs(30)).await;
        live.shutdown();
        a.resign();
        assert!(asked.is_ok(), "never asked: {text}");
        assert!(said.iter().any(|s| s == "pool b: removed"), "{said:?}");
        assert_eq!(status, Some(2), "after {took:?}: {text}");
        assert!(
            text.contains("refused by the leader: pool b is not served: a reload removed it"),
            "{text}"
        );
        assert!(took < Duration::from_secs(15), "refused after {took:?}");
    });
}

/// Whether a run was asked (a `requests/` key appeared) under `prefix`
/// within 10 s.
async fn asked_under(
    direct: &poolgate::ha::etcd::Etcd,
    prefix: &[u8],
) -> Result<(), tokio::time::error::Elapsed> {
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let keys = direct.keys_under(prefix).unwrap_or_default();
            if keys
                .iter()
                .any(|k| String::from_utf8_lossy(k).contains("requests/"))
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
}

/// A `poolgate run --pool POOL --timeout 20s -- true` among replicas on
/// `endpoint`, from a file of its own (`pools`, then the rest as a
/// requester beside no replica has it), logging at info.
struct Requester {
    child: std::process::Child,
    dir: std::path::PathBuf,
    started: tokio::time::Instant,
}

impl Requester {
    fn start(name: &str, label: &str, endpoint: &str, pools: &str, pool: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("poolgate-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let config = dir.join("config.toml");
        std::fs::write(
            &config,
            format!(
                "{pools}[readiness]\nconvergence_window = \"20ms\"\n\
                 [swim]\nbind = \"127.0.0.1:0\"\ninsecure = true\nlabel = \"{label}\"\n\
                 [agents]\nlisten = \"127.0.0.1:{}\"\n\
                 [state]\netcd = [\"{endpoint}\"]\nlease = \"10s\"\ninsecure = true\n",
                etcd::free_port(),
            ),
        )
        .unwrap();
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_poolgate"))
            .args(["run", "--pool", pool, "--config"])
            .arg(&config)
            .args(["--timeout", "20s", "--", "true"])
            .env("RUST_LOG", "info")
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(dir.join("run.log")).unwrap())
            .spawn()
            .unwrap();
        Self {
            child,
            dir,
            started: tokio::time::Instant::now(),
        }
    }

    /// Its exit code once it exits (within `bound`, or it is killed and
    /// the test fails), how long after its start, and what it said.
    async fn exit_within(&mut self, bound: Duration) -> (Option<i32>, Duration, String) {
        let exited = tokio::time::timeout(bound, async {
            loop {
                if let Ok(Some(status)) = self.child.try_wait() {
                    return status;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await;
        let took = self.started.elapsed();
        let _ = self.child.kill();
        let _ = self.child.wait();
        let text = std::fs::read_to_string(self.dir.join("run.log")).unwrap_or_default();
        let status = exited.unwrap_or_else(|_| panic!("run did not exit: {text}"));
        (status.code(), took, text)
    }
}

impl Drop for Requester {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
