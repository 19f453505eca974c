//! The control socket served and asked in-process: takeovers, a requester
//! gone, guarded runs, beats, idle connections.

use super::*;
use poolgate_actors::core::{Event, NodeId, PoolId, RunId};
use poolgate_actors::core::{OnReadinessLost, PlanningPolicy, PoolDefinition};
use poolgate_actors::Fleet;
use poolgate_actors::GateSettings;
use std::path::{Path, PathBuf};

fn n(s: &str) -> NodeId {
    NodeId::new(s).unwrap()
}

async fn ready_fleet() -> Fleet {
    ready_pools(&[("a", &["n1", "n2"])]).await
}

/// A fleet of `pools` over n1 and n2, every node ready.
async fn ready_pools(pools: &[(&str, &[&str])]) -> Fleet {
    let policy = PlanningPolicy {
        on_readiness_lost: OnReadinessLost::Wait,
        wait_timeout: None,
    };
    let settings = pools
        .iter()
        .map(|(id, members)| {
            let members = members.iter().map(|m| n(m)).collect();
            let definition = PoolDefinition::new(PoolId::new(id).unwrap(), members).unwrap();
            GateSettings::new(definition, Duration::from_millis(10), policy).unwrap()
        })
        .collect();
    let fleet = Fleet::try_start(settings).unwrap();
    for name in ["n1", "n2"] {
        poolgate_actors::testing::make_ready_in(&fleet, &n(name), name.as_bytes())
            .await
            .unwrap();
    }
    fleet
}

/// `run`, over `node`, committed on `gate` once it is ready (a run some
/// other requester holds).
async fn commit_run(gate: &poolgate_actors::Gate, run: &str, node: &str) -> RunId {
    let ready = gate.wait_ready().await.unwrap();
    let run = RunId::new(run).unwrap();
    gate.begin_planning(run.clone(), Some(ready.epoch))
        .await
        .unwrap();
    gate.commit_plan(run.clone(), vec![n(node)], Some(ready.epoch))
        .await
        .unwrap();
    run
}

fn socket(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!(
        "poolgate-control-{}-{name}.sock",
        std::process::id()
    ))
}

async fn ask_run(path: &Path, run: &str, required: &[&str]) -> (Client, Reply) {
    let mut client = Client::connect(path).await.unwrap();
    let request = Request::Run {
        v: 1,
        pool: None,
        run: run.into(),
        required: Some(required.iter().map(|r| r.to_string()).collect()),
    };
    client.ask(&request).await.unwrap();
    loop {
        match client.next().await.unwrap() {
            Reply::Event { .. } => continue,
            reply => return (client, reply),
        }
    }
}

#[test]
fn a_plan_that_can_never_be_committed_is_refused_before_it_plans_and_the_pool_serves_the_next() {
    actix::System::new().block_on(async {
        let fleet = ready_fleet().await;
        let path = socket("refused");
        let bound = bind(&path).await.unwrap();
        let served = actix::spawn(serve(bound, fleet.clone(), "test".into()));
        // A node no pool has: refused, and the pool not held planning.
        let (_first, refused) = ask_run(&path, "r1", &["n1", "zz"]).await;
        assert!(
            matches!(&refused, Reply::Refused { code, .. } if code == "not_candidate"),
            "{refused:?}"
        );
        let a = fleet.pool(&PoolId::new("a").unwrap()).unwrap();
        assert_eq!(a.report().await.unwrap().run, None);
        let (_second, committed) = ask_run(&path, "r2", &["n1"]).await;
        assert_eq!(
            committed,
            Reply::Committed {
                run: "r2".into(),
                epoch: 1
            }
        );
        served.abort();
    });
}

/// The next reply that is not an event (nor a beat), within 5 s.
async fn next_word(client: &mut Client) -> Reply {
    tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match client.next().await.unwrap() {
                Reply::Event { .. } | Reply::Alive => continue,
                reply => return reply,
            }
        }
    })
    .await
    .expect("no word within 5 s")
}

/// Asks for run `run` of pool `pool` over `required`.
async fn ask_of(path: &Path, pool: &str, run: &str, required: &[&str]) -> Client {
    let mut client = Client::connect(path).await.unwrap();
    let request = Request::Run {
        v: 1,
        pool: Some(pool.into()),
        run: run.into(),
        required: Some(required.iter().map(|r| r.to_string()).collect()),
    };
    client.ask(&request).await.unwrap();
    client
}

#[test]
fn a_run_waiting_for_a_pool_not_ready_is_refused_once_a_reload_takes_its_node_out() {
    // An operator's trial: refused only at the pool's next `PoolReady`,
    // so with the pool never ready it waited out its timeout.
    actix::System::new().block_on(async {
        // n3 is never ready: neither is the pool.
        let fleet = ready_pools(&[("a", &["n1", "n2", "n3"][..])]).await;
        let path = socket("unready");
        let bound = bind(&path).await.unwrap();
        let served = actix::spawn(serve(bound, fleet.clone(), "test".into()));
        let mut client = ask_of(&path, "a", "r1", &["n1", "n2"]).await;
        let a = fleet.pool(&PoolId::new("a").unwrap()).unwrap();
        let members = vec![n("n1"), n("n3")];
        a.define_pool(PoolDefinition::new(PoolId::new("a").unwrap(), members).unwrap())
            .await
            .unwrap();
        let told = next_word(&mut client).await;
        assert!(
            matches!(&told, Reply::Refused { code, .. } if code == "not_candidate"),
            "{told:?}"
        );
        served.abort();
    });
}

/// A fleet of pools a (n2) and b (n1, n2), a's run holding n2, its
/// control socket (`name`) served, and run r1 asked of pool b over n1
/// and n2: planning, and told it waits for n2.
async fn waiting_behind_a_held_node(name: &str) -> (Fleet, tokio::task::JoinHandle<()>, Client) {
    let fleet = ready_pools(&[("a", &["n2"][..]), ("b", &["n1", "n2"][..])]).await;
    let a = fleet.pool(&PoolId::new("a").unwrap()).unwrap();
    commit_run(&a, "held", "n2").await;
    let path = socket(name);
    let bound = bind(&path).await.unwrap();
    let served = actix::spawn(serve(bound, fleet.clone(), "test".into()));
    let mut client = ask_of(&path, "b", "r1", &["n1", "n2"]).await;
    let told = next_word(&mut client).await;
    assert!(matches!(told, Reply::Waiting { .. }), "{told:?}");
    (fleet, served, client)
}

#[test]
fn a_run_waiting_for_a_pool_a_reload_removes_is_refused_naming_it() {
    actix::System::new().block_on(async {
        let (fleet, served, mut client) = waiting_behind_a_held_node("removed").await;
        fleet.remove_pool(&PoolId::new("b").unwrap()).await.unwrap();
        let told = next_word(&mut client).await;
        assert!(
            matches!(&told, Reply::Refused { detail, .. } if detail.contains("pool b is no longer gated here")),
            "{told:?}"
        );
        served.abort();
    });
}

#[test]
fn a_run_waiting_when_the_orchestrator_stops_is_not_told_its_pool_was_removed() {
    // An operator's trial: a watch stopped (SIGTERM) told each waiting
    // run that a reload removed its pool, exit 2 (refused for good).
    actix::System::new().block_on(async {
        let (fleet, served, mut client) = waiting_behind_a_held_node("stopping").await;
        fleet.stop();
        let told = tokio::time::timeout(Duration::from_secs(5), client.next())
            .await
            .expect("no word within 5 s");
        assert!(
            !matches!(&told, Some(Reply::Refused { .. })),
            "a stopping orchestrator refused the run: {told:?}"
        );
        served.abort();
    });
}

#[test]
fn a_run_asked_behind_one_still_planning_waits_and_commits_once_that_one_is_refused() {
    // An operator's trial: beside a watch, a run asked while another was
    // still planning was refused as in the way (exit 4), though that one
    // was refused a moment later and the pool was free.
    actix::System::new().block_on(async {
        // Pool b's run holds n2: r1 (n1, n2) plans, then waits for it.
        let fleet = ready_pools(&[("a", &["n1", "n2"][..]), ("b", &["n2"][..])]).await;
        let b = fleet.pool(&PoolId::new("b").unwrap()).unwrap();
        commit_run(&b, "held", "n2").await;
        let path = socket("behind");
        let bound = bind(&path).await.unwrap();
        let served = actix::spawn(serve(bound, fleet.clone(), "test".into()));
        let mut first = ask_of(&path, "a", "r1", &["n1", "n2"]).await;
        let told = next_word(&mut first).await;
        assert!(matches!(told, Reply::Waiting { .. }), "{told:?}");
        let mut second = ask_of(&path, "a", "r2", &["n1"]).await;
        let told = next_word(&mut second).await;
        assert!(
            matches!(&told, Reply::Waiting { detail } if detail.contains("r1")),
            "{told:?}"
        );
        // n2 taken out of pool a: r1 can never be committed.
        let a = fleet.pool(&PoolId::new("a").unwrap()).unwrap();
        let members = vec![n("n1")];
        a.define_pool(PoolDefinition::new(PoolId::new("a").unwrap(), members).unwrap())
            .await
            .unwrap();
        let told = next_word(&mut first).await;
        assert!(
            matches!(&told, Reply::Refused { code, .. } if code == "not_candidate"),
            "{told:?}"
        );
        let committed = loop {
            match next_word(&mut second).await {
                Reply::Waiting { .. } => continue,
                reply => break reply,
            }
        };
        assert!(
            matches!(&committed, Reply::Committed { run, .. } if run == "r2"),
            "{committed:?}"
        );
        served.abort();
    });
}

#[test]
fn a_run_left_planning_by_its_requester_is_taken_over_by_the_next_and_a_requester_gone_ends_its_run(
) {
    actix::System::new().block_on(async {
        // Pool b's run holds n2: a run of pool a over n2 plans, then
        // waits for it.
        let fleet = ready_pools(&[("a", &["n1", "n2"][..]), ("b", &["n2"][..])]).await;
        let b = fleet.pool(&PoolId::new("b").unwrap()).unwrap();
        let held = commit_run(&b, "held", "n2").await;
        let path = socket("orphans");
        let bound = bind(&path).await.unwrap();
        let served = actix::spawn(serve(bound, fleet.clone(), "test".into()));
        let ask = |run: &'static str| {
            let path = path.clone();
            async move {
                let mut client = Client::connect(&path).await.unwrap();
                let request = Request::Run {
                    v: 1,
                    pool: Some("a".into()),
                    run: run.into(),
                    required: Some(vec!["n2".into()]),
                };
                client.ask(&request).await.unwrap();
                client
            }
        };
        let mut first = ask("r1").await;
        let told = first.next().await.unwrap();
        assert!(matches!(told, Reply::Waiting { .. }), "{told:?}");
        // Its requester gone while it plans: left planning for the next.
        drop(first);
        // Refused as in the way until the server has seen r1's requester
        // go; then r2's request takes r1 over and waits for n2.
        let mut second = loop {
            let mut client = ask("r2").await;
            let told = loop {
                match client.next().await.unwrap() {
                    Reply::Event { .. } => continue,
                    told => break told,
                }
            };
            match told {
                Reply::Waiting { .. } => break client,
                Reply::Refused { code, .. } if code == "run_in_progress" => {
                    tokio::time::sleep(Duration::from_millis(5)).await
                }
                other => panic!("{other:?}"),
            }
        };
        b.finish_run(held).await.unwrap();
        let committed = loop {
            match second.next().await.unwrap() {
                Reply::Event { .. } | Reply::Alive | Reply::Waiting { .. } => continue,
                reply => break reply,
            }
        };
        assert!(
            matches!(&committed, Reply::Committed { run, .. } if run == "r1"),
            "the run left planning is taken over: {committed:?}"
        );
        // Its requester gone: the run is ended.
        let mut events = fleet.subscribe();
        drop(second);
        let ended = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                if let Some(Event::RunFinished { run, .. }) = events.recv().await {
                    return run;
                }
            }
        })
        .await
        .unwrap();
        assert_eq!(ended.as_str(), "r1");
        served.abort();
        let _ = served.await;
        assert!(!path.exists(), "the socket goes with its server");
    });
}

#[test]
fn a_committed_run_nobody_guards_is_resumed_or_ended_through_the_socket() {
    actix::System::new().block_on(async {
        let fleet = ready_fleet().await;
        let gate = fleet.pool(&PoolId::new("a").unwrap()).unwrap();
        // A committed run with no requester (as one restored is).
        commit_run(&gate, "r1", "n1").await;
        let path = socket("resume");
        let bound = bind(&path).await.unwrap();
        let served = actix::spawn(serve(bound, fleet.clone(), "test".into()));
        // A new run is told what ends the one nobody guards.
        let mut newcomer = Client::connect(&path).await.unwrap();
        let asked = Request::Run {
            v: 1,
            pool: None,
            run: "r5".into(),
            required: None,
        };
        newcomer.ask(&asked).await.unwrap();
        let told = newcomer.next().await.unwrap();
        assert!(
            matches!(&told, Reply::Refused { detail, .. } if detail.contains("--end r1")),
            "{told:?}"
        );
        // Another run is refused, naming nothing it could take over.
        let stranger = RunId::new("r9").unwrap();
        assert_eq!(
            end_run(&path, None, &stranger)
                .await
                .unwrap()
                .map(|w| w.contains("r9")),
            Some(true)
        );
        let mut client = Client::connect(&path).await.unwrap();
        let resume = Request::Resume {
            v: 1,
            pool: None,
            run: "r1".into(),
        };
        client.ask(&resume).await.unwrap();
        let committed = loop {
            match client.next().await.unwrap() {
                Reply::Event { .. } | Reply::Alive => continue,
                reply => break reply,
            }
        };
        assert!(
            matches!(&committed, Reply::Committed { run, .. } if run == "r1"),
            "{committed:?}"
        );
        // Guarded now: nobody else ends it or takes it.
        let r1 = RunId::new("r1").unwrap();
        let refused = end_run(&path, None, &r1).await.unwrap().unwrap();
        assert!(
            refused.contains("guarded by its own requester"),
            "{refused}"
        );
        let mut other = Client::connect(&path).await.unwrap();
        other.ask(&resume).await.unwrap();
        let taken = other.next().await.unwrap();
        assert!(
            matches!(&taken, Reply::Refused { code, .. } if code == "run_guarded"),
            "{taken:?}"
        );
        client.ask(&Request::Finish).await.unwrap();
        let ended = loop {
            match client.next().await.unwrap() {
                Reply::Event { .. } | Reply::Alive => continue,
                reply => break reply,
            }
        };
        assert!(
            matches!(&ended, Reply::Ended { status, .. } if status == "finished"),
            "{ended:?}"
        );
        // And `run --end` of a run nobody guards ends it.
        let r2 = commit_run(&gate, "r2", "n1").await;
        assert_eq!(end_run(&path, Some("a"), &r2).await.unwrap(), None);
        assert_eq!(gate.report().await.unwrap().run, None);
        served.abort();
    });
}

#[test]
fn a_run_waiting_on_a_node_another_pools_run_holds_is_told_why_then_committed() {
    actix::System::new().block_on(async {
        let fleet = ready_pools(&[("a", &["n1", "n2"][..]), ("b", &["n2"][..])]).await;
        let a = fleet.pool(&PoolId::new("a").unwrap()).unwrap();
        let r1 = commit_run(&a, "r1", "n2").await;
        let path = socket("waiting");
        let bound = bind(&path).await.unwrap();
        let served = actix::spawn(serve(bound, fleet.clone(), "test".into()));
        let mut client = Client::connect(&path).await.unwrap();
        let asked = Request::Run {
            v: 1,
            pool: Some("b".into()),
            run: "r2".into(),
            required: None,
        };
        client.ask(&asked).await.unwrap();
        let told = client.next().await.unwrap();
        assert_eq!(
            told,
            Reply::Waiting {
                detail: "node n2 is reserved by run r1 of pool a".into()
            }
        );
        a.finish_run(r1).await.unwrap();
        let committed = loop {
            match client.next().await.unwrap() {
                Reply::Event { .. } | Reply::Alive | Reply::Waiting { .. } => continue,
                reply => break reply,
            }
        };
        assert!(
            matches!(&committed, Reply::Committed { run, .. } if run == "r2"),
            "{committed:?}"
        );
        served.abort();
    });
}

#[test]
fn a_connection_that_asks_nothing_is_closed_so_idle_ones_cannot_hold_the_room() {
    actix::System::new().block_on(async {
        let fleet = ready_fleet().await;
        let path = socket("idle");
        let bound = bind(&path).await.unwrap();
        let served = actix::spawn(serve(bound, fleet, "test".into()));
        let began = std::time::Instant::now();
        let mut idle = Client::connect(&path).await.unwrap();
        let closed = tokio::time::timeout(FIRST_LINE * 2, idle.next()).await;
        assert!(
            matches!(closed, Ok(None)),
            "closed, not answered: {closed:?}"
        );
        assert!(began.elapsed() >= FIRST_LINE);
        served.abort();
    });
}

#[test]
fn a_full_room_of_connections_that_ask_nothing_makes_way_for_one_that_asks() {
    actix::System::new().block_on(async {
        let fleet = ready_fleet().await;
        let path = socket("full");
        let bound = bind(&path).await.unwrap();
        let served = actix::spawn(serve(bound, fleet, "test".into()));
        let mut idle = Vec::new();
        for _ in 0..MAX_CONNECTIONS + 10 {
            idle.push(Client::connect(&path).await.unwrap());
        }
        let began = std::time::Instant::now();
        let answer = status(&path, None).await;
        assert!(answer.is_ok(), "{answer:?}");
        assert!(
            began.elapsed() < FIRST_LINE,
            "answered at once, {:?}",
            began.elapsed()
        );
        served.abort();
    });
}

#[test]
fn a_socket_served_is_not_taken_a_stale_one_is_replaced_and_no_other_file_is() {
    actix::System::new().block_on(async {
        let path = socket("taken");
        let _ = std::fs::remove_file(&path);
        // Another kind of file is not taken for a socket.
        std::fs::write(&path, b"notes").unwrap();
        let refused = bind(&path).await.err().unwrap().to_string();
        assert!(refused.contains("not a socket"), "{refused}");
        assert_eq!(std::fs::read(&path).unwrap(), b"notes");
        std::fs::remove_file(&path).unwrap();
        // A stale socket (nobody serving it) is replaced.
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        assert!(path.exists() && !is_served(&path));
        let first = bind(&path).await.unwrap();
        assert!(is_served(&path));
        let second = bind(&path).await.err().unwrap().to_string();
        assert!(
            second.contains("served by another orchestrator"),
            "{second}"
        );
        drop(first);
        assert!(!path.exists());
    });
}
